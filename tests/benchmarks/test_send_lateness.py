"""Benchmark: how late `slo bench` sends at 200 requests/s (goal: p99 < 1 ms).

Lateness is the instant a request's task starts sending (`slo.cli.bench.runner._Run.one`)
minus the instant the arrival process scheduled it (Poisson, seed 3). Peers, in the same run,
against the same server:
- httpx.AsyncClient with the same pacing: what `slo bench` sent with before
  `slo.cli.bench.lean_http` (its pool scans every connection on every request);
- the lean client paced by a plain `asyncio.sleep` until each send is due (what the pacer
  did before: asyncio's sleep wakes up to a millisecond late, epoll waits in whole ms).

The server is the K-slot stand-in with room to spare (64 slots of 20 ms: 3,200 req/s) in its
own process, so only the client is measured; its CPU per request is the benchmark process's
CPU time over the requests sent.

Run alone, by hand (a quiet machine: another process on the two cores delays the wake-ups):
    python -m pytest tests/benchmarks/test_send_lateness.py -o addopts= -s -p no:cacheprovider
LATENESS_SECONDS (default 20) sets each run's length.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest

from slo.capacity.arrivals import Lateness, lateness_of
from slo.cli.bench import runner
from slo.cli.bench.client import RequestSettings
from slo.cli.bench.profiles import get_profile, plan_requests
from tests.benchmarks.bench_record import ROOT, load_average, stamp, table, write_section
from tests.helpers.slot_server import slot_server_process

RATE = 200.0
SECONDS = float(os.environ.get("LATENESS_SECONDS", "20"))
PAGE = ROOT / "docs" / "benchmarks" / "send-lateness.md"


async def _plain_sleep(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


def _run(
    url: str, transport: httpx.AsyncBaseTransport | None = None, seconds: float = SECONDS
) -> tuple[Lateness, float]:
    """The run's lateness and the client's CPU milliseconds per request."""
    plan = plan_requests(
        get_profile("voice"), int(RATE * seconds), seed=3, max_model_len=4096, rate=RATE
    )
    settings = RequestSettings("slots", "chat")
    cpu_at = time.process_time()
    result = asyncio.run(
        runner.run_plan(url, plan, settings, concurrency=None, duration_limit_s=seconds * 3,
                        out=None, progress=False, transport=transport)
    )  # fmt: skip
    cpu_ms = (time.process_time() - cpu_at) * 1e3 / max(1, len(result.records))
    assert len(result.records) == len(plan), "every request must finish"
    return lateness_of(result.late_s, result.sent_at, RATE), cpu_ms


@contextmanager
def _pacer(until: Callable[[float], object]) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner, "_until", until)
        yield


def test_send_lateness_at_200_requests_per_second() -> None:
    load_at_start = load_average()
    # What slo bench built before: no limits on httpx's pool.
    unlimited = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    with slot_server_process(64, 0.02) as url:
        _run(url, seconds=min(SECONDS, 2.0))  # warm-up: imports, the server's connections
        runs = {"slo bench: lean HTTP/1.1 client, sleep then yield until due": _run(url)}
        httpx_peer = "peer: httpx.AsyncClient, same pacing"
        runs[httpx_peer] = _run(url, httpx.AsyncHTTPTransport(limits=unlimited))
        with _pacer(_plain_sleep):
            runs["peer: lean client, asyncio.sleep until due"] = _run(url)
    rows = [
        [name, f"{s.p50_s * 1e3:.3f}", f"{s.p99_s * 1e3:.3f}", f"{s.max_s * 1e3:.2f}",
         f"{s.achieved_rate or 0:.1f}", f"{cpu_ms:.2f}"]
        for name, (s, cpu_ms) in runs.items()
    ]  # fmt: skip
    text = "\n".join(
        [
            stamp(load_at_start),
            f"Poisson arrivals at {RATE:g} req/s for {SECONDS:g} s against the K-slot stand-in "
            "(64 x 20 ms, its own process); lateness = when the request's task starts sending "
            "minus its schedule.",
            "",
            table(["client", "p50 ms", "p99 ms", "max ms", "sent req/s", "CPU ms/request"], rows),
        ]
    )
    print("\n" + text)
    write_section(PAGE, "slo bench: send lateness", "send-lateness", text)
    ours, _ = next(iter(runs.values()))
    assert ours.p99_s < 0.001, f"p99 send lateness {ours.p99_s * 1e3:.3f} ms (goal < 1 ms)"
    assert (ours.achieved_rate or 0) > 0.95 * RATE, f"sent {ours.achieved_rate} req/s"
    assert ours.p99_s < runs[httpx_peer][0].p99_s
