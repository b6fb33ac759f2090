"""/slo.html shows, per tier, the requests the engine's scheduler shed since start, by reason,
read from the same counter /metrics exports (llm_slo_shed_requests_total)."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry

from engine.hooks import StepStats
from middleware.clock import ScriptedClock
from middleware.live import LiveSLO
from middleware.live.page import respond
from middleware.metrics.metric_set import MetricSet
from slo.spec import SLOSpec
from tests.helpers.tier_specs import make_tier, spec_yaml

SPEC = spec_yaml(
    make_tier("premium", "p95 ttft <= 200ms", priority=0),
    make_tier("standard", "p95 ttft <= 1s", priority=1, default=True),
    min_events=1,
)


def step(shed: tuple[tuple[int, str], ...]) -> StepStats:
    return StepStats(
        step=1, time_ns=0, step_time_s=0.01, batch_size=1, prefill_tokens=0, decode_tokens=1,
        num_waiting=0, num_running=1, num_preempted=0, kv_blocks_total=8, kv_blocks_free=6,
        shed=shed,
    )  # fmt: skip


def test_shed_counts_show_by_tier_and_reason() -> None:
    live = LiveSLO(SLOSpec.from_yaml(SPEC), clock=ScriptedClock())
    metrics = MetricSet(live.spec, "tiny", CollectorRegistry())
    metrics.observe_engine_step(step(((1, "ttft_out_of_reach"), (1, "ttft_out_of_reach"))))
    metrics.observe_engine_step(step(((1, "queue_full"), (0, "ttft_out_of_reach"))))
    code, _, body = respond(live, False, "view=page", metrics)
    assert code == 200
    data = json.loads(body)
    assert data["engine"]["shed"] == {
        "premium": {"ttft_out_of_reach": 1.0, "queue_full": 0.0},
        "standard": {"ttft_out_of_reach": 2.0, "queue_full": 1.0},
    }
    tiers = {tier["tier"]: tier for tier in data["tiers"]}
    assert tiers["standard"]["shed"] == {"ttft_out_of_reach": 2.0, "queue_full": 1.0}
    # The page's script renders them (a tier without an engine has no line at all).
    code, _, html = respond(live, True, "", metrics)
    assert code == 200 and b"shed by the scheduler since start" in html


def test_no_engine_no_shed_line() -> None:
    live = LiveSLO(SLOSpec.from_yaml(SPEC), clock=ScriptedClock())
    data = json.loads(respond(live, False, "view=page", None)[2])
    assert data["engine"] is None
    assert all(tier["shed"] is None for tier in data["tiers"])
