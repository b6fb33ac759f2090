"""The processes and readings of tests/benchmarks/test_engine_span_intake.py: `slo proxy` and
the upstream as test_proxy_overhead starts them, pinned to cores; the span exporter
(otlp_span_sender.py) as a child process; the proxy's intake counters and RSS.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from middleware.intake.join import SpanJoin
from slo.cli.bench.server import free_port
from tests.conftest import require_or_skip

GOAL_SPANS_PER_S = 5000.0
SPANS_PER_EXPORT = 512  # the OpenTelemetry SDK's BatchSpanProcessor max_export_batch_size
MAX_HELD = SpanJoin().max_held  # what `slo proxy` holds at most (its SpanJoin defaults)
MINUTES = float(os.environ.get("LLM_SLO_BENCH_SPAN_MINUTES", "10"))  # of the memory run
RSS_EVERY_S = 10.0


def two_cores() -> tuple[int, int]:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2 or shutil.which("taskset") is None:
        require_or_skip("needs two cores and taskset (util-linux) to pin the proxy to one")
    return cores[0], cores[1]


def pinned(core: int, command: list[str]) -> list[str]:
    return ["taskset", "-c", str(core), *command]


@contextlib.contextmanager
def on_core(core: int) -> Iterator[None]:
    """This process (the clients) on `core`, and back as it was afterwards."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def servers(tmp_path: Path, core: int, other_core: int) -> tuple[list[str], list[str], int, int]:
    """The upstream's and the proxy's commands (as test_proxy_overhead runs them), pinned."""
    upstream_port, proxy_port = free_port(), free_port()
    upstream = [sys.executable, "-m", "tests.helpers.proxy_upstream", "--port", str(upstream_port)]
    proxy = [sys.executable, "-m", "slo.cli", "proxy", "--upstream"]
    proxy += [f"http://127.0.0.1:{upstream_port}", "--port", str(proxy_port)]
    proxy += ["--store", f"sqlite:///{tmp_path / 'records.db'}"]
    return pinned(other_core, upstream), pinned(core, proxy), upstream_port, proxy_port


@contextlib.contextmanager
def exporter(
    port: int, core: int, out: Path, rate: float, seconds: float | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """The span sender on `core`, once it has built its export; stopped (SIGTERM) on leaving."""
    command = [sys.executable, "-m", "tests.benchmarks.otlp_span_sender"]
    command += ["--url", f"http://127.0.0.1:{port}/v1/traces", "--rate", str(rate)]
    command += ["--batch", str(SPANS_PER_EXPORT), "--out", str(out)]
    command += ["--seconds", str(seconds)] if seconds is not None else []
    sender = subprocess.Popen(pinned(core, command), stdout=subprocess.PIPE)
    try:
        assert sender.stdout is not None
        assert sender.stdout.readline() == b"sending\n", "the span sender did not start"
        yield sender
    finally:
        if sender.poll() is None:
            sender.terminate()
        assert sender.wait(timeout=120) == 0, "the span sender failed"
        sender.stdout.close()  # type: ignore[union-attr]


def intake_counts(port: int) -> dict[str, float]:
    """The proxy's llm_slo_engine_span* counters, from its /metrics."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("llm_slo_engine_span")
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def expected_unmatched(sent: int) -> int:
    # Every span is for a trace no request of ours carries (the proxy made none of these
    # traceparents), so SpanJoin.wanted drops each on arrival, counted as unmatched: none is
    # held (holding is for a span of a request still in flight).
    return sent


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024  # kB
    raise AssertionError(f"/proc/{pid}/status has no VmRSS")


def core_busy_s(core: int) -> float:
    """Seconds `core` has spent on anything but idle since boot (/proc/stat)."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{core} "):
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, line.split()[1:9])
            return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    raise AssertionError(f"/proc/stat has no cpu{core}")
