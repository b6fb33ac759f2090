"""What `slo proxy` costs with TLS on both sides, against nginx doing the same with the same
certificates, in the same run.

    uptime   # run alone, on a quiet machine
    python -m pytest tests/benchmarks/test_tls_proxy_overhead.py -o addopts="" -s \
        -p no:cacheprovider

The setting of tests/benchmarks/test_proxy_overhead.py (its loads, driver and figures), with
every hop encrypted: the OpenAI-style upstream serves HTTPS (uvicorn, httptools), `slo proxy`
serves HTTPS (`--ssl-certfile`) and verifies the upstream (`https://`, `--upstream-ca-certs`),
nginx does both too (`listen ... ssl`, `proxy_pass https://`, `proxy_ssl_verify on` with the
same CA, upstream keep-alive and session reuse). The client verifies against the test's CA,
keeps its connections alive, and speaks TLS 1.3 to all three (direct, slo proxy, nginx).

Measured per variant: TTFT p50 at the client ("added": minus direct's), each proxy's CPU per
streamed SSE event (all its threads' time on CPU, from schedstat), throughput in events per
second. Goal (issue 28): CPU per event within 3x nginx's at every load; the added TTFT is
reported. Writes docs/benchmarks/tls-proxy-overhead.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from middleware.proxy.client import UpstreamPool
from slo.cli.bench.server import free_port, stop_process
from tests.benchmarks.bench_record import ROOT, load_average, stamp, table, write_section
from tests.helpers.proxy_load import (
    EVENTS_PER_STREAM,
    TOKENS,
    Load,
    Measured,
    cpu_seconds,
    one_stream,
    process_tree,
    summarize,
)
from tests.helpers.tls import Pki, make_pki, wait_until_https_ready

LOADS = {
    "1 stream": Load(1, 120, 0.001),
    "64 streams": Load(64, 8, 0.010),
}
ROUNDS = int(os.environ.get("LLM_SLO_BENCH_ROUNDS", "3"))
PAGE = ROOT / "docs" / "benchmarks" / "tls-proxy-overhead.md"

NGINX_CONF = """
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream engine {{ server 127.0.0.1:{upstream}; keepalive 128; }}
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.2 TLSv1.3;
        location / {{
            proxy_pass https://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate {ca};
            proxy_ssl_name localhost;  # nginx matches DNS names only, not IP SANs
            proxy_ssl_session_reuse on;
        }}
    }}
}}
"""


async def drive_tls(port: int, load: Load, context: ssl.SSLContext) -> Measured:
    """test_proxy_overhead's driver over TLS: the same requests, spread and counting."""
    streams, itl_s = load.streams, load.itl_s
    pool = UpstreamPool("127.0.0.1", port, max_connections=streams, read_timeout_s=60)
    pool.use_tls(context)
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        | {"max_tokens": TOKENS}
    ).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"content-type: application/json\r\nx-llm-tier: premium\r\n"
        b"x-test-itl-s: %s\r\ncontent-length: %d\r\n\r\n" % (str(itl_s).encode(), len(body))
    )
    ttfts: list[float] = []
    events = 0
    stream_s = EVENTS_PER_STREAM * itl_s

    async def client(index: int) -> None:
        nonlocal events
        if not load.lockstep:
            await asyncio.sleep(stream_s * index / streams)
        for _ in range(load.per_stream):
            ttft, seen = await one_stream(pool, head, body)
            ttfts.append(ttft)
            events += seen

    started = time.perf_counter()
    await asyncio.gather(*(client(index) for index in range(streams)))
    wall_s = time.perf_counter() - started
    pool.close()
    return Measured(ttfts, events, wall_s, 0.0)


def measure(port: int, pids: list[int], load: Load, context: ssl.SSLContext) -> Measured:
    before = cpu_seconds(pids)
    result = asyncio.run(drive_tls(port, load, context))
    result.cpu_s = cpu_seconds(pids) - before if pids else 0.0
    assert result.events == load.streams * load.per_stream * EVENTS_PER_STREAM, result.events
    return result


@contextlib.contextmanager
def process(
    command: list[str], ready_url: str, log: Path, context: ssl.SSLContext
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as output:
        child = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        try:
            wait_until_https_ready(ready_url, context, process=child)
            yield child
        finally:
            stop_process(child)


def _commands(tmp_path: Path, pki: Pki, ports: dict[str, int]) -> dict[str, list[str]]:
    upstream = [
        sys.executable, "-m", "uvicorn", "--factory",
        "tests.helpers.proxy_upstream:OpenAIUpstream", "--host", "127.0.0.1",
        "--port", str(ports["direct"]), "--http", "httptools", "--log-level", "warning",
        "--no-access-log", "--ssl-certfile", str(pki.server_cert),
        "--ssl-keyfile", str(pki.server_key),
    ]  # fmt: skip
    proxy = [
        sys.executable, "-m", "slo.cli", "proxy",
        "--upstream", f"https://127.0.0.1:{ports['direct']}",
        "--upstream-ca-certs", str(pki.ca), "--port", str(ports["slo proxy"]),
        "--store", f"sqlite:///{tmp_path / 'records.db'}",
        "--ssl-certfile", str(pki.server_cert), "--ssl-keyfile", str(pki.server_key),
        "--upstream-metrics", "off", "--provider-name", "test",
    ]  # fmt: skip
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    (tmp_path / "nginx.conf").write_text(
        NGINX_CONF.format(
            tmp=tmp_path,
            upstream=ports["direct"],
            port=ports["nginx"],
            cert=pki.server_cert,
            key=pki.server_key,
            ca=pki.ca,
        )
    )
    nginx_cmd = [nginx, "-e", str(tmp_path / "error.log"), "-p", str(tmp_path), "-c"]
    return {
        "direct": upstream,
        "slo proxy": proxy,
        "nginx": [*nginx_cmd, str(tmp_path / "nginx.conf")],
    }


def test_tls_proxy_overhead(tmp_path: Path) -> None:
    if not os.path.exists(shutil.which("nginx") or "/usr/sbin/nginx"):
        pytest.skip("nginx is not installed (apt-get install nginx-light)")
    load_at_start = load_average()
    pki = make_pki(tmp_path / "pki")
    client = pki.client_context()
    client.minimum_version = ssl.TLSVersion.TLSv1_3
    ports = {name: free_port() for name in ("direct", "slo proxy", "nginx")}
    commands = _commands(tmp_path, pki, ports)
    with contextlib.ExitStack() as stack:
        children = {
            name: stack.enter_context(
                process(
                    command,
                    f"https://127.0.0.1:{ports[name]}/health",
                    tmp_path / f"{name.replace(' ', '-')}.log",
                    client,
                )
            )
            for name, command in commands.items()
        }
        variants = {
            "direct": (ports["direct"], []),
            "slo proxy": (ports["slo proxy"], [children["slo proxy"].pid]),
            "nginx": (ports["nginx"], process_tree(children["nginx"].pid)),
        }
        report = {}
        for load_name, load in LOADS.items():
            warm_up = Load(load.streams, 1, 0.0, lockstep=True)
            for port, _pids in variants.values():
                asyncio.run(drive_tls(port, warm_up, client))
            runs: dict[str, list[Measured]] = {name: [] for name in variants}
            names = list(variants)
            for round_index in range(ROUNDS):
                for name in names[round_index:] + names[:round_index]:
                    port, pids = variants[name]
                    runs[name].append(measure(port, pids, load, client))
            report[load_name] = summarize(runs)
    print("\n" + json.dumps(report, indent=2))
    write_page(report, load_at_start)
    misses = [
        f"CPU per event <= 3x nginx's at {load_name}"
        for load_name in LOADS
        if report[load_name]["cpu_us_per_event"]["ratio slo/nginx (goal <= 3)"] > 3.0
    ]
    assert not misses, f"goals missed: {misses}"


def write_page(report: dict[str, dict[str, dict[str, float]]], load_at_start: str) -> None:
    rows = [
        [
            load_name,
            figures["added_ttft_p50_ms"]["slo proxy"],
            figures["added_ttft_p50_ms"]["nginx"],
            figures["cpu_us_per_event"]["slo proxy"],
            figures["cpu_us_per_event"]["nginx"],
            figures["cpu_us_per_event"]["ratio slo/nginx (goal <= 3)"],
            figures["throughput_vs_direct"]["slo proxy"],
            figures["throughput_vs_direct"]["nginx"],
        ]
        for load_name, figures in report.items()
    ]
    header = ["load", "added TTFT p50, slo proxy (ms)", "added TTFT p50, nginx (ms)",
              "CPU per SSE event, slo proxy (us)", "CPU per SSE event, nginx (us)",
              "CPU ratio (goal <= 3)", "throughput vs direct, slo proxy",
              "throughput vs direct, nginx"]  # fmt: skip
    text = "\n\n".join([
        "## TLS on both sides: added latency and CPU per SSE event, against nginx",
        stamp(load_at_start),
        f"Medians over {ROUNDS} interleaved rounds; client, proxies and upstream all speak "
        "TLS (1.3 from the client), one CA. Goal: CPU per event <= 3x nginx's at every load. "
        "Command: `python -m pytest tests/benchmarks/test_tls_proxy_overhead.py "
        "-o addopts=\"\" -s -p no:cacheprovider`.",
        table(header, rows),
    ])  # fmt: skip
    write_section(PAGE, "slo proxy with TLS: what it adds", "tls-proxy-overhead", text)
