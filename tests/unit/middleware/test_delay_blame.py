"""The engine's blame in the middleware: `llm_slo_delay_caused_seconds_total` is born at 0 for
every tier, culprit tier and cause (and 'none' for queue time nobody caused), counts what a
blame names by the spec's tiers, and the bridge puts the record's bounded `delay_blame` on the
request's timeline, culprits named by tier; the record validates it and refuses a bad one."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from middleware import ScriptedClock
from middleware.metrics.metric_set import MetricSet
from middleware.request.blame import blame_record
from middleware.request.bridge import EngineBridge
from middleware.request.timeline import RequestTimeline
from slo.engine_slis import DELAY_CAUSES, NO_CULPRIT
from slo.records import RecordError, validate_record
from slo.sli import CATALOG
from slo.spec import SLOSpec

SPEC = SLOSpec.default()
PREMIUM, BATCH = SPEC.tiers[0], SPEC.tiers[-1]
METRIC = CATALOG["delay_caused"].metric.removesuffix("_total")
RECORD = {"request_id": "r", "tier": "t", "timestamp": 1.0, "e2e_s": 1.0}


@dataclass(frozen=True)
class Blame:
    """What `engine.blame.RequestBlame` carries, made by hand."""

    priority: int
    queue_s: float = 0.3
    preempted_s: float = 0.5
    decode_s: float = 2.0
    decode_only_s: float = 1.5
    interference_s: float = 0.5
    by_tier: tuple[tuple[str, int | None, float, int], ...] = (
        ("queue", BATCH.priority, 0.25, 4),
        ("queue", None, 0.05, 0),
        ("interference", BATCH.priority, 0.5, 2),
        ("preemption", 99, 0.5, 1),  # a priority no tier has
    )
    top: tuple[tuple[str, str, int, float], ...] = (
        ("interference", "b1", BATCH.priority, 0.4),
        ("preemption", "x", 99, 0.5),
    )


def counts(metrics: MetricSet) -> dict[tuple[str, str, str], float]:
    return {
        (s.labels["tier"], s.labels["culprit_tier"], s.labels["cause"]): s.value
        for family in metrics.registry.collect()
        if family.name == METRIC
        for s in family.samples
        if s.name.endswith("_total")
    }


def test_the_delay_counter_is_born_at_zero_for_every_tier_culprit_and_cause() -> None:
    metrics = MetricSet(SPEC, "tiny", CollectorRegistry())
    names = [tier.name for tier in SPEC.tiers]
    expected = {(t, c, cause): 0.0 for t in names for c in names for cause in DELAY_CAUSES}
    expected |= {(t, NO_CULPRIT, "queue"): 0.0 for t in names}
    assert counts(metrics) == expected


def test_a_blame_counts_by_tier_and_the_bridge_keeps_it_on_the_timeline() -> None:
    metrics = MetricSet(SPEC, "tiny", CollectorRegistry())
    tiers = {tier.priority: tier.name for tier in SPEC.tiers}
    bridge = EngineBridge(on_blame=metrics.engine.observe_blame, tier_names=tiers)
    timeline = RequestTimeline.begin("p1", ScriptedClock())
    bridge.register(timeline)
    bridge.on_blame("p1", 10, Blame(PREMIUM.priority))
    bridge.on_blame("elsewhere", 11, Blame(PREMIUM.priority))  # no timeline: still counted
    seen = counts(metrics)
    assert seen[(PREMIUM.name, BATCH.name, "queue")] == pytest.approx(0.5)
    assert seen[(PREMIUM.name, NO_CULPRIT, "queue")] == pytest.approx(0.1)
    assert seen[(PREMIUM.name, BATCH.name, "interference")] == pytest.approx(1.0)
    assert sum(seen.values()) == pytest.approx(1.6)  # priority 99 is no tier: not counted
    blame = timeline.delay_blame
    assert blame is not None
    assert blame["queue_s"] == 0.3 and blame["interference_s"] == 0.5
    assert blame["by_tier"][0] == {"cause": "queue", "tier": BATCH.name, "s": 0.25, "requests": 4}
    assert [entry["tier"] for entry in blame["by_tier"]] == [
        BATCH.name,
        NO_CULPRIT,
        BATCH.name,
        "99",
    ]
    assert blame["top"][0] == {
        "cause": "interference",
        "request_id": "b1",
        "tier": BATCH.name,
        "s": 0.4,
    }
    assert validate_record({**RECORD, "delay_blame": blame})["delay_blame"] == blame


@pytest.mark.parametrize(
    "change",
    [
        {"queue_s": -1.0},
        {"by_tier": [{"cause": "gravity", "tier": "b", "s": 1.0, "requests": 1}]},
        {"by_tier": [{"cause": "queue", "tier": "b", "s": 1.0}]},
        {"top": [{"cause": "queue", "request_id": "r", "tier": "b", "s": 0.1}] * 4},
        {"extra": 1},
    ],
)
def test_the_record_refuses_a_blame_that_is_not_one(change: dict[str, object]) -> None:
    blame = {**blame_record(Blame(PREMIUM.priority), {}), **change}
    with pytest.raises(RecordError, match="field 'delay_blame': expected a delay blame object"):
        validate_record({**RECORD, "delay_blame": blame})
