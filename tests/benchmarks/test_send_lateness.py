"""Benchmark: how late `slo bench` sends at 200 requests/s (goal: p99 < 1 ms).

Peer, in the same run: the same client pacing with a plain `asyncio.sleep` until each send
is due (what `slo bench` did before: asyncio's sleep wakes up to a millisecond late, epoll
waits in whole milliseconds). The server is the K-slot stand-in with room to spare (64 slots
of 20 ms: 3,200 req/s), in its own process, so only the client's own pacing is measured.

Run alone, by hand:
    python -m pytest tests/benchmarks/test_send_lateness.py -o addopts= -s -p no:cacheprovider
LATENESS_SECONDS (default 20) sets each run's length.
"""

from __future__ import annotations

import asyncio
import os
import time

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


def _run(url: str) -> Lateness:
    plan = plan_requests(
        get_profile("voice"), int(RATE * SECONDS), seed=3, max_model_len=4096, rate=RATE
    )
    settings = RequestSettings("slots", "chat")
    result = asyncio.run(
        runner.run_plan(
            url,
            plan,
            settings,
            concurrency=None,
            duration_limit_s=SECONDS * 3,
            out=None,
            progress=False,
        )
    )
    return lateness_of(result.late_s, result.sent_at, RATE)


def test_send_lateness_at_200_requests_per_second(monkeypatch: pytest.MonkeyPatch) -> None:
    load_at_start = load_average()
    with slot_server_process(64, 0.02) as url:
        ours = _run(url)
        with monkeypatch.context() as patch:
            patch.setattr(runner, "_until", _plain_sleep)
            peer = _run(url)
    rows = [
        [
            name,
            f"{s.p50_s * 1e3:.3f}",
            f"{s.p99_s * 1e3:.3f}",
            f"{s.max_s * 1e3:.2f}",
            f"{s.achieved_rate or 0:.1f}",
        ]
        for name, s in (
            ("slo bench (sleep, then yield until due)", ours),
            ("peer: asyncio.sleep until due", peer),
        )
    ]
    text = "\n".join(
        [
            stamp(load_at_start),
            f"Poisson arrivals at {RATE:g} req/s for {SECONDS:g} s against the K-slot stand-in "
            "(64 x 20 ms); lateness = when the request's task starts minus its schedule.",
            "",
            table(["pacing", "p50 ms", "p99 ms", "max ms", "sent req/s"], rows),
        ]
    )
    print("\n" + text)
    write_section(PAGE, "slo bench: send lateness", "send-lateness", text)
    assert ours.p99_s < 0.001, f"p99 send lateness {ours.p99_s * 1e3:.3f} ms (goal < 1 ms)"
    assert ours.p99_s < peer.p99_s
