"""What `slo proxy` (middleware on) adds in front of an engine, against direct access and nginx.

    uptime   # run alone, on a quiet machine
    python -m pytest tests/benchmarks/test_proxy_overhead.py -o addopts="" -s -p no:cacheprovider

One fast OpenAI-style upstream (tests/helpers/proxy_upstream.py, its own process) serves 32-token
chat streams (role chunk, 32 text deltas, finish chunk, `[DONE]`: 35 SSE events). The same
load runs against it directly, through `slo proxy` and through Debian's nginx as a reverse
proxy (proxy_buffering off, HTTP/1.1 upstream keep-alive), rounds interleaved:
- 1 stream, requests one after another, 1 ms between tokens;
- 64 concurrent streams, 10 ms between tokens (a busy engine's pace), in steady state: the 64
  clients start spread over one stream's length, as users arriving on their own do, then each
  sends its next request as soon as its stream ends;
- the same 64 streams in lockstep: all start in the same millisecond, and since every stream
  is as long as the others they end, and start again, together (a thundering herd, the worst
  case for one event loop: its TTFT is reported, not judged; its CPU and throughput are).

Measured per variant: TTFT p50 at the client (to the first text delta; "added" = minus
direct's), the proxy's CPU per streamed SSE event (all its threads' time on CPU from
/proc/PID/task/*/schedstat, in ns, before/after), throughput in events per second. Goals
(issue 29; issue 13 asked 1 ms, 3x and 90%): added TTFT p50 <= 0.5 ms at one stream and <= 2x
nginx's (floored at 0.5 ms) at 64 streams (steady); CPU per event within 1.5x nginx's and
throughput >= 95% of direct at every load. nginx's own CPU per event is reported beside it: the
host's speed, so a ratio reads the same on slow and fast hosts.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from slo.cli.bench.server import free_port
from tests.benchmarks.bench_record import ROOT, load_average, stamp, table, write_section
from tests.helpers.proxy_load import (
    CPU_RATIO,
    CPU_RATIO_KEY,
    LOADS,
    NGINX_CONF,
    ROUNDS,
    Load,
    Measured,
    drive,
    measure,
    process,
    process_tree,
    summarize,
)

# Issue 29's goals (the third, CPU_RATIO, lives beside summarize, whose figures name it).
ADDED_TTFT_MS = 0.5  # at 1 stream; at 64, 2x nginx's added TTFT, floored at this
THROUGHPUT = 0.95  # of direct access
PAGE = ROOT / "docs" / "benchmarks" / "proxy-overhead.md"


def test_proxy_overhead(tmp_path: Path) -> None:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(nginx):
        pytest.skip("nginx is not installed (apt-get install nginx-light)")
    load_at_start = load_average()
    upstream_port, proxy_port, nginx_port = free_port(), free_port(), free_port()
    (tmp_path / "nginx.conf").write_text(
        NGINX_CONF.format(tmp=tmp_path, upstream=upstream_port, port=nginx_port)
    )
    upstream_cmd = [
        sys.executable,
        "-m",
        "tests.helpers.proxy_upstream",
        "--port",
        str(upstream_port),
    ]
    proxy_cmd = [
        sys.executable,
        "-m",
        "slo.cli",
        "proxy",
        "--upstream",
        f"http://127.0.0.1:{upstream_port}",
        "--port",
        str(proxy_port),
        "--store",
        f"sqlite:///{tmp_path / 'records.db'}",
    ]
    nginx_cmd = [nginx, "-e", str(tmp_path / "error.log"), "-p", str(tmp_path), "-c"]
    nginx_cmd.append(str(tmp_path / "nginx.conf"))
    upstream_url = f"http://127.0.0.1:{upstream_port}"
    with (
        process(upstream_cmd, upstream_url + "/health", tmp_path / "upstream.log"),
        process(
            proxy_cmd, f"http://127.0.0.1:{proxy_port}/health", tmp_path / "proxy.log"
        ) as proxy,
        process(
            nginx_cmd, f"http://127.0.0.1:{nginx_port}/health", tmp_path / "nginx.log"
        ) as nginx_master,
    ):
        variants = {
            "direct": (upstream_port, []),
            "slo proxy": (proxy_port, [proxy.pid]),
            "nginx": (nginx_port, process_tree(nginx_master.pid)),
        }
        report = {}
        for load_name, load in LOADS.items():
            warm_up = Load(load.streams, 1, 0.0, lockstep=True)
            for port, _pids in variants.values():  # warm up: connections, caches, label children
                asyncio.run(drive(port, warm_up))
            runs: dict[str, list[Measured]] = {name: [] for name in variants}
            names = list(variants)
            for round_index in range(ROUNDS):
                for name in names[round_index:] + names[:round_index]:
                    port, pids = variants[name]
                    runs[name].append(measure(port, pids, load))
            report[load_name] = summarize(runs)
    print("\n" + json.dumps(report, indent=2))
    write_page(report, load_at_start)
    one, many = report["1 stream"], report["64 streams"]
    misses = [
        goal
        for goal, met in (
            (
                f"added TTFT p50 <= {ADDED_TTFT_MS} ms at 1 stream",
                one["added_ttft_p50_ms"]["slo proxy"] <= ADDED_TTFT_MS,
            ),
            (
                # nginx adds ~0 here: a floor of 0.5 ms keeps "2x" from judging noise
                "added TTFT p50 <= 2x nginx's at 64 streams",
                many["added_ttft_p50_ms"]["slo proxy"]
                <= 2 * max(many["added_ttft_p50_ms"]["nginx"], ADDED_TTFT_MS),
            ),
            *(
                (
                    f"CPU per event <= {CPU_RATIO}x nginx's at {load_name}",
                    report[load_name]["cpu_us_per_event"][CPU_RATIO_KEY] <= CPU_RATIO,
                )
                for load_name in LOADS
            ),
            *(
                (
                    f"throughput >= {THROUGHPUT:.0%} of direct at {load_name}",
                    report[load_name]["throughput_vs_direct"]["slo proxy"] >= THROUGHPUT,
                )
                for load_name in LOADS
            ),
        )
        if not met
    ]
    assert not misses, f"goals missed: {misses}"


def write_page(report: dict[str, dict[str, dict[str, float]]], load_at_start: str) -> None:
    """The run's figures on docs/benchmarks/proxy-overhead.md, stamped with commit and date."""
    rows = [
        [
            load_name,
            figures["added_ttft_p50_ms"]["slo proxy"],
            figures["added_ttft_p50_ms"]["nginx"],
            figures["cpu_us_per_event"]["slo proxy"],
            figures["cpu_us_per_event"]["nginx"],
            figures["cpu_us_per_event"][CPU_RATIO_KEY],
            figures["throughput_vs_direct"]["slo proxy"],
        ]
        for load_name, figures in report.items()
    ]
    header = ["load", "added TTFT p50, slo proxy (ms)", "added TTFT p50, nginx (ms)",
              "CPU per SSE event, slo proxy (us)", "CPU per SSE event, nginx (us)",
              f"CPU ratio (goal <= {CPU_RATIO})",
              f"throughput vs direct (goal >= {THROUGHPUT:.2f})"]  # fmt: skip
    text = "\n\n".join([
        "## Added latency and CPU per SSE event, against direct access and nginx",
        stamp(load_at_start),
        f"Medians over {ROUNDS} interleaved rounds; goals (issue 29): added TTFT p50 <= "
        f"{ADDED_TTFT_MS} ms at 1 stream and <= 2x nginx's (floored at {ADDED_TTFT_MS} ms) at "
        f"64 steady streams, CPU per event <= {CPU_RATIO}x nginx's (nginx's own: the host's "
        f"speed), throughput >= {THROUGHPUT:.0%} of direct. Command: `python -m pytest "
        "tests/benchmarks/test_proxy_overhead.py -o addopts=\"\" -s -p no:cacheprovider`.",
        table(header, rows),
    ])  # fmt: skip
    write_section(PAGE, "slo proxy: what it adds in front of an engine", "proxy-overhead", text)
