"""The SLO-headroom gauge, read from a real server's `/metrics`, crosses its autoscaling
target before premium's TTFT objective breaks under a rising load, and falls back after.

The server is the real LatencyMiddleware over a scripted engine with a known capacity (K
slots of prefill + decode; tests/helpers/hooked_slot_engine.py) in its own uvicorn process;
the load is `slo bench`'s open-loop runner, its rate rising past the capacity then dropping
to a third of it; a scraper reads `/metrics` every quarter second meanwhile.

The first SLO miss: the first premium request (in send order) at which the p90 TTFT of the
last 20 premium requests is over the objective, the server's own TTFT: the earliest instant
a p90 objective can be judged broken, without one stalled request of a shared machine
counting as the breach.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slo.cli.bench import runner
from slo.cli.bench.client import RequestSettings
from slo.cli.bench.profiles import PlannedRequest
from slo.headroom import DEFAULT_TARGET
from slo.sli import CATALOG
from tests.helpers.hooked_slot_engine import hooked_engine_process

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SPEC = """
version: 1
tiers:
  - name: premium
    priority: 0
    match: {header: x-llm-tier, values: [premium]}
    objectives: ["p90 ttft <= 1s"]
  - name: standard
    priority: 1
    default: true
    match: {header: x-llm-tier, values: [standard]}
    objectives: ["p95 ttft <= 2s"]
"""
THRESHOLD_S = 1.0
SLOTS, PREFILL_S, DECODE_S = 2, 0.02, 0.08
CAPACITY_RPS = SLOTS / (PREFILL_S + DECODE_S)  # 20 requests/s
ROLLING = 20  # premium requests in the p90 that judges the objective


def ramp(start_rps: float, slope: float, ramp_s: float, after_rps: float, after_s: float):
    """Arrival offsets: the rate rises linearly from start_rps for ramp_s seconds, then holds
    at after_rps for after_s; each offset with the rate at that instant."""
    offsets: list[tuple[float, float]] = []
    t = 0.0
    while t < ramp_s + after_s:
        rate = start_rps + slope * t if t < ramp_s else after_rps
        offsets.append((t, rate))
        t += 1.0 / rate
    return offsets


def _plan(offsets: list[tuple[float, float]]) -> list[PlannedRequest]:
    return [PlannedRequest(index, "premium", "hello", 4, 2, offset)
            for index, (offset, _) in enumerate(offsets)]  # fmt: skip


async def _scrape(url: str, stop: asyncio.Event, seen: list[tuple[float, float]]) -> None:
    """(wall clock when asked, premium's ratio) every quarter second until `stop`."""
    gauge = CATALOG["ttft_headroom"].metric
    async with httpx.AsyncClient(timeout=10) as client:
        while not stop.is_set():
            asked = time.time()
            text = (await client.get(url + "/metrics")).text
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name == gauge and sample.labels.get("tier") == "premium":
                        seen.append((asked, sample.value))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)


async def _drive(url: str, plan: list[PlannedRequest]):
    stop = asyncio.Event()
    seen: list[tuple[float, float]] = []
    scraper = asyncio.create_task(_scrape(url, stop, seen))
    await asyncio.sleep(0.5)  # a first scrape before the load: the drain rate's start
    result = await runner.run_plan(
        url, plan, RequestSettings("slots", "chat"), concurrency=None,
        duration_limit_s=120, out=None, progress=False,
    )  # fmt: skip
    await asyncio.sleep(1.0)
    stop.set()
    await scraper
    return result, seen


def _first_miss(records: list[dict]) -> float | None:
    """Send time of the first premium request at which the rolling p90 TTFT is over."""
    ordered = sorted((r for r in records if r["tier"] == "premium" and r["outcome"] == "ok"),
                     key=lambda r: r["timestamp"])  # fmt: skip
    for index in range(ROLLING, len(ordered) + 1):
        window = sorted(r.get("ttft_s", r.get("client_ttft_s", math.inf))
                        for r in ordered[index - ROLLING : index])  # fmt: skip
        if window[math.ceil(0.9 * ROLLING) - 1] > THRESHOLD_S:
            return ordered[index - 1]["timestamp"]
    return None


def test_headroom_signal_leads_the_first_slo_miss_and_falls_back(tmp_path: Path) -> None:
    spec_path = tmp_path / "slo.yaml"
    spec_path.write_text(SPEC)
    # 10 -> 27 req/s over 17 s (past the 20 req/s capacity at 10 s), then 6 req/s for 12 s
    offsets = ramp(10.0, 1.0, 17.0, 6.0, 12.0)
    with hooked_engine_process(spec_path, SLOTS, PREFILL_S, DECODE_S) as url:
        result, seen = asyncio.run(_drive(url, _plan(offsets)))
    start = result.started_at
    assert len(result.records) == len(offsets), "every request must finish"
    assert any(r.get("ttft_s") is not None for r in result.records), "no server TTFT"
    breach = _first_miss(result.records)
    assert breach is not None, "the load never broke premium's objective: no breach to lead"
    crossed = next((at for at, ratio in seen if ratio > DEFAULT_TARGET), None)
    assert crossed is not None, f"the gauge never crossed {DEFAULT_TARGET}: {seen}"
    timeline = [(round(at - start, 2), round(ratio, 3)) for at, ratio in seen]
    assert crossed < breach, (
        f"crossed at {crossed - start:.2f} s, first miss at {breach - start:.2f} s: {timeline}"
    )
    # Quiet while the load is well under capacity: no signal without a queue.
    calm_until = start + next(t for t, rate in offsets if rate >= 0.75 * CAPACITY_RPS)
    assert all(ratio < DEFAULT_TARGET for at, ratio in seen if at < calm_until), timeline
    # Back under the target once the load drops to a third of the capacity, and it stays.
    dropped = start + 17.0
    after = [(at, ratio) for at, ratio in seen if at > dropped]
    recovered = next(i for i, (_, ratio) in enumerate(after) if ratio < DEFAULT_TARGET)
    assert all(ratio < DEFAULT_TARGET for _, ratio in after[recovered:]), timeline
    assert after[recovered][0] < dropped + 10.0, timeline
