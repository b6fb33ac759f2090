"""/slo.html shows, per tier, who made it wait since start: the largest share of the wait its
headline objective feels and who caused it, and the largest shares of all its blamed wait,
read from the counter /metrics exports (llm_slo_delay_caused_seconds_total)."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import CollectorRegistry

from engine.blame import RequestBlame
from middleware.clock import ScriptedClock
from middleware.live import LiveSLO
from middleware.live.page import respond
from middleware.metrics.metric_set import MetricSet
from slo.spec import SLOSpec
from tests.helpers.tier_specs import make_tier, spec_yaml

SPEC = spec_yaml(
    make_tier("premium", "p99 itl <= 50ms", priority=0),
    make_tier("batch", "p95 ttft <= 10s", priority=2, default=True),
    min_events=1,
)


def blame(priority: int, *by_tier: tuple[str, int | None, float, int]) -> RequestBlame:
    return RequestBlame(priority, 0.0, 0.0, 0.0, 0.0, 0.0, by_tier, ())


def page(metrics: MetricSet | None, live: LiveSLO) -> dict[str, Any]:
    code, _, body = respond(live, False, "view=page", metrics)
    assert code == 200
    return {tier["tier"]: tier for tier in json.loads(body)["tiers"]}


def test_the_headline_names_who_caused_most_of_what_the_objective_feels() -> None:
    live = LiveSLO(SLOSpec.from_yaml(SPEC), clock=ScriptedClock())
    metrics = MetricSet(live.spec, "tiny", CollectorRegistry())
    # Premium queued 0.5 s behind premium and 0.2 s behind nobody; batch's prefill slowed its
    # decode by 0.62 s and premium's own by 0.38 s. Its objective is ITL: interference counts.
    metrics.engine.observe_blame(blame(0, ("queue", 0, 0.5, 2), ("queue", None, 0.2, 0)))
    metrics.engine.observe_blame(blame(0, ("interference", 2, 0.62, 3)))
    metrics.engine.observe_blame(blame(0, ("interference", 0, 0.38, 1)))
    metrics.engine.observe_blame(blame(0, ("preemption", 2, 0.001, 1)))  # too small to show
    tiers = page(metrics, live)
    premium = tiers["premium"]["blame"]
    assert premium["headline"] == "p99 ITL: 62% batch prefill interference"
    assert premium["total_s"] == 1.701 and premium["estimated"] is False
    assert [(t["culprit"], t["cause"], t["share"]) for t in premium["top"]] == [
        ("batch", "interference", round(0.62 / 1.701, 6)),
        ("premium", "queue", round(0.5 / 1.701, 6)),
        ("premium", "interference", round(0.38 / 1.701, 6)),
    ]
    assert tiers["batch"]["blame"] is None  # nothing blamed: no line
    html = respond(live, True, "", metrics)[2]
    assert b"who made it wait since start" in html
    assert b"p99 ITL: 62% batch prefill interference" in html  # the inlined data


def test_a_ttft_objective_feels_the_queue_and_estimates_say_so() -> None:
    live = LiveSLO(SLOSpec.from_yaml(SPEC), clock=ScriptedClock())
    metrics = MetricSet(live.spec, "tiny", CollectorRegistry())
    metrics.engine.bear_estimated()
    queue = {"cause": "queue", "tier": "premium", "s": 0.3, "requests": 1}
    slow = {"cause": "interference", "tier": "premium", "s": 5.0, "requests": 1}
    metrics.engine.observe_estimated("batch", {"by_tier": [queue, slow]})
    tiny = {"cause": "queue", "tier": "none", "s": 0.0001, "requests": 0}  # too small to show
    metrics.engine.observe_estimated("batch", {"by_tier": [tiny]})
    batch = page(metrics, live)["batch"]["blame"]
    # The largest share of all is interference, but TTFT feels only the queue.
    assert [t["text"] for t in batch["top"]] == [
        "94% premium prefill interference (estimated)",
        "6% premium queue (estimated)",
    ]
    assert batch["headline"] == "p95 TTFT: 100% premium queue (estimated)"
    assert batch["estimated"] is True


def test_without_metrics_no_tier_has_blame() -> None:
    live = LiveSLO(SLOSpec.from_yaml(SPEC), clock=ScriptedClock())
    assert all(tier["blame"] is None for tier in page(None, live).values())
