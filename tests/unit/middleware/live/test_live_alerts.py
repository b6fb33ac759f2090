"""The in-process evaluator fires the spec's alerts with the generated rules' semantics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from middleware.clock import ScriptedClock
from middleware.live import LiveSLO
from middleware.metrics.histograms import bucket_counts
from middleware.metrics.metric_set import MetricSet
from middleware.request.timeline import Breakdown
from slo.spec import SLOSpec
from tests.helpers.hotpath import each_hotpath  # noqa: F401  (runs each test on both hot paths)
from tests.helpers.live_traffic import SPEC, feed
from tests.helpers.tier_specs import make_tier, spec_yaml


def names(live: LiveSLO) -> set[tuple[str, str]]:
    return {(a["alertname"], a["labels"]["tier"]) for a in live.firing_alerts()}


def test_healthy_traffic_fires_nothing() -> None:
    clock = ScriptedClock()
    live = LiveSLO(SLOSpec.from_yaml(SPEC), clock=clock)
    feed(live, clock, "premium", 200, 0.05)
    assert names(live) == set()
    status = live.status()
    premium = status["tiers"][0]
    assert premium["objectives"][0]["verdict"] == "met"
    assert premium["objectives"][0]["events"] == 200


def test_slow_premium_fires_burn_rate_and_threshold_for_premium_only() -> None:
    clock = ScriptedClock()
    live = LiveSLO(SLOSpec.from_yaml(SPEC), clock=clock)
    feed(live, clock, "standard", 100, 0.3)
    feed(live, clock, "premium", 100, 0.9)
    firing = names(live)
    assert ("LLMSLOTTFTBudgetBurn", "premium") in firing
    assert ("LLMSLOTTFTPercentileHigh", "premium") in firing
    assert all(tier == "premium" for _, tier in firing)
    ttft = live.status()["tiers"][0]["objectives"][0]
    assert ttft["verdict"] == "violated" and ttft["observed"] > 0.2


def test_low_traffic_guard() -> None:
    clock = ScriptedClock()
    live = LiveSLO(SLOSpec.from_yaml(SPEC), clock=clock)
    feed(live, clock, "premium", 9, 5.0)  # one fewer than min_events
    assert names(live) == set()
    feed(live, clock, "premium", 1, 5.0)
    assert ("LLMSLOTTFTBudgetBurn", "premium") in names(live)


def test_errors_burn_availability_and_windows_slide() -> None:
    clock = ScriptedClock()
    live = LiveSLO(SLOSpec.from_yaml(SPEC), clock=clock)
    feed(live, clock, "premium", 50, 0.05)
    feed(live, clock, "premium", 50, 0.05, outcome="server_error")
    feed(live, clock, "premium", 50, 0.05, outcome="client_error")  # not the service's fault
    assert ("LLMSLOAvailabilityBudgetBurn", "premium") in names(live)
    availability = live.status()["tiers"][0]["objectives"][1]
    assert availability["events"] == 100 and availability["good"] == 50
    clock.advance_ms(11 * 60 * 1000)  # past the long window: the burn is history ...
    # ... but the SLO window (30d) still holds it: the whole budget is spent, and has been
    # since the first look (11 minutes, more than the ticket's 5m `for`).
    assert names(live) == {("LLMSLOErrorBudgetExhausted", "premium")}


def test_budget_exhausted_fires_after_its_for_and_only_with_enough_events() -> None:
    clock = ScriptedClock()
    live = LiveSLO(SLOSpec.from_yaml(SPEC), clock=clock)
    feed(live, clock, "premium", 9, 0.05, outcome="server_error")  # one fewer than min_events
    assert names(live) == set()
    clock.advance_ms(6 * 60 * 1000)
    assert names(live) == set()  # the guard: never pending, so never firing
    feed(live, clock, "premium", 1, 0.05, outcome="server_error")
    budget = ("LLMSLOErrorBudgetExhausted", "premium")
    assert budget not in names(live)  # pending from now
    clock.advance_ms(299 * 1000)
    assert budget not in names(live)
    clock.advance_ms(1000)
    assert budget in names(live)
    labels = next(a["labels"] for a in live.firing_alerts() if a["alertname"] == budget[0])
    assert labels == {"alertname": budget[0], "severity": "warning", "urgency": "ticket",
                      "tier": "premium", "sli": "availability",
                      "objective": "availability >= 99%"}  # fmt: skip


ITL_SPEC = spec_yaml(
    make_tier(
        "premium",
        "p95 ttft <= 200ms",
        "99% of gaps itl <= 50ms",
        "goodput >= 95%",
        priority=0,
        default=True,
    )
)


def test_itl_gaps_counted_once_for_metrics_and_windows_give_the_same_status() -> None:
    """The middleware counts a request's gaps on the itl buckets once and hands the counts to
    both the histogram and the windows: the windows must count exactly as from the gaps."""
    spec = SLOSpec.from_yaml(ITL_SPEC)
    clock = ScriptedClock()
    shared = LiveSLO(spec, clock=clock)
    own = LiveSLO(spec, clock=clock)
    assert shared.itl_bounds == MetricSet(spec, "m", CollectorRegistry()).itl_bounds
    gaps_seen = 0
    for index in range(200):
        gaps = tuple((index * 7 + k * 13) % 90 / 1000 for k in range(index % 9))
        ttft = 0.05 if index % 5 else 0.3
        observed = Breakdown(
            e2e_s=ttft + sum(gaps), ttft_s=ttft, tpot_s=None, itl_s=gaps, network_s=0.0,
            queue_s=None, prefill_s=None, decode_s=sum(gaps), detokenize_s=0.0, other_s=0.0,
            output_tokens=len(gaps) + 1,
        )  # fmt: skip
        shared.observe("premium", "ok", observed, bucket_counts(shared.itl_bounds, gaps))
        own.observe("premium", "ok", observed)
        gaps_seen += len(gaps)
        clock.advance_ms(10)
    status = shared.status()
    assert status == own.status()
    objectives = {o["objective"]: o for o in status["tiers"][0]["objectives"]}
    itl = objectives["99% of gaps itl <= 50ms"]
    assert itl["events"] == gaps_seen
    assert itl["good"] == sum(
        (index * 7 + k * 13) % 90 <= 50 for index in range(200) for k in range(index % 9)
    )
    assert objectives["goodput >= 95%"]["events"] == 200
    assert objectives["goodput >= 95%"]["good"] == 160  # every fifth request is slow
