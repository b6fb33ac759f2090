"""The per-tier SLO-headroom gauge: its arithmetic by hand, and that it crosses its target
before the tier's TTFT objective breaks under a rising load, and falls back after."""

from __future__ import annotations

import heapq
import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from middleware.metrics.headroom import HeadroomCollector
from slo.headroom import DEFAULT_TARGET, GAUGE, WINDOW_S, headroom_ratio, promql, signals
from slo.sli import CATALOG
from slo.spec import SLOSpec

SPEC = SLOSpec.from_yaml(
    """
version: 1
tiers:
  - name: premium
    priority: 0
    match: {header: x-llm-tier, values: [premium]}
    objectives: ["p90 ttft <= 200ms", "p99 ttft <= 1s"]
  - name: standard
    priority: 1
    default: true
    match: {header: x-llm-tier, values: [standard]}
    objectives: ["p95 ttft <= 1s"]
  - name: batch
    priority: 2
    match: {header: x-llm-tier, values: [batch]}
    objectives: ["p99 e2e <= 60s"]
"""
)


class Series:
    """The llm_slo_* series the middleware exports, as real prometheus_client metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.queue = Gauge(
            CATALOG["queue_depth"].metric, "waiting", ["tier", "model"], registry=self.registry
        )
        self.requests = Counter(
            CATALOG["requests"].metric.removesuffix("_total"),
            "done",
            ["tier", "model", "route", "outcome"],
            registry=self.registry,
        )
        self.prefill = Histogram(
            CATALOG["prefill"].metric, "prefill", ["tier", "model", "route"], registry=self.registry
        )
        self.now = 0.0
        self.collector = HeadroomCollector(SPEC, self.registry, clock=lambda: self.now)
        self.registry.register(self.collector)

    def ratios(self) -> dict[str, float]:
        family = next(f for f in self.registry.collect() if f.name == GAUGE)
        return {s.labels["tier"]: s.value for s in family.samples}


def test_the_ratio_worked_by_hand() -> None:
    # 6 waiting ahead, 12 req/s draining, 50 ms prefill: 0.5 + 0.05 = 0.55 s over 200 ms.
    assert headroom_ratio(6, 12, 0.05, 0.2) == pytest.approx(2.75)
    # nothing drains: one request per window, the floor
    assert headroom_ratio(1, 0, 0, 1.0) == pytest.approx(WINDOW_S)
    found = {s.tier: s for s in signals(SPEC)}
    assert set(found) == {"premium", "standard"}  # batch has no TTFT objective
    assert found["premium"].threshold_s == 0.2 and found["premium"].ahead == ("premium",)
    assert found["standard"].ahead == ("premium", "standard")


def test_the_collector_reads_the_exported_series() -> None:
    series = Series()
    series.ratios()  # the first scrape: no rate yet
    series.queue.labels("premium", "m").set(2)
    series.queue.labels("standard", "m").set(4)
    series.requests.labels("premium", "m", "/v1/chat/completions", "ok").inc(100)
    for _ in range(10):
        series.prefill.labels("premium", "m", "/v1/chat/completions").observe(0.05)
    series.now = 10.0
    ratios = series.ratios()
    # premium: 2 waiting / 10 req/s + 0.05 s = 0.25 s over 0.2 s; standard: 6 / 10 + 0 over 1 s
    assert ratios["premium"] == pytest.approx(1.25)
    assert ratios["standard"] == pytest.approx(0.6)


def test_the_promql_names_the_catalogs_series_and_the_tiers_ahead() -> None:
    premium, standard = signals(SPEC)
    query = promql(standard)
    assert 'llm_slo_queue_depth{tier=~"premium|standard"}' in query
    assert "rate(llm_slo_requests_total[2m])" in query
    assert 'llm_slo_prefill_time_seconds_sum{tier="standard"}' in query
    assert query.endswith("/ 1")
    assert promql(premium).endswith("/ 0.2")


def _simulate(series: Series, rates: list[float], slots: int = 4, hold_s: float = 0.1):
    """A K-slot server (K / T = 40 req/s) under a load that rises then falls, second by second:
    each second, the gauge as scraped and the premium TTFT p90 of the requests of that second."""
    free = [0.0] * slots
    waiting_until: list[float] = []  # start times of requests not yet started
    t = 0.0
    for second, rate in enumerate(rates):
        ttfts = []
        arrivals = [second + i / rate for i in range(int(rate))]
        for arrival in arrivals:
            start = max(arrival, heapq.heappop(free))
            heapq.heappush(free, start + hold_s)
            ttfts.append(start - arrival)
            waiting_until.append(start)
            series.requests.labels("premium", "m", "/v1/completions", "ok").inc()
        t = second + 1.0
        waiting = sum(1 for start in waiting_until if start > t)
        waiting_until = [start for start in waiting_until if start > t]
        series.queue.labels("premium", "m").set(waiting)
        series.now = t
        p90 = sorted(ttfts)[math.ceil(0.9 * len(ttfts)) - 1]
        yield series.ratios()["premium"], p90


def test_the_signal_crosses_its_target_before_the_slo_breaks_and_falls_back_after() -> None:
    rising = [20 + 2 * i for i in range(14)]  # 20 .. 46 req/s: past 40 at second 11
    falling = [30] * 40
    series = Series()
    series.ratios()
    seen = list(_simulate(series, rising + falling))
    crossed = next(i for i, (ratio, _) in enumerate(seen) if ratio > DEFAULT_TARGET)
    breached = next(i for i, (_, p90) in enumerate(seen) if p90 > 0.2)
    assert crossed < breached, seen
    # once the load falls back under capacity, so does the signal, and it stays there
    recovered = next(
        i for i, (ratio, _) in enumerate(seen) if i > breached and ratio < DEFAULT_TARGET
    )
    assert recovered <= len(rising) + 1
    assert all(ratio < DEFAULT_TARGET for ratio, _ in seen[recovered:]), seen
    assert all(p90 <= 0.2 for _, p90 in seen[recovered + 2 :]), seen
