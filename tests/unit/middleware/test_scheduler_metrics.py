"""Tier-isolation metrics: born at 0 per tier (and reason), fed from the engine's StepStats,
and on the generated dashboard; every name from the SLI catalog."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from dashboards.panels import rows
from engine.hooks import StepStats
from middleware.metrics.metric_set import MetricSet
from slo.sli import CATALOG, SHED_REASONS
from slo.spec import SLOSpec

NAMES = ("preemptions", "scheduler_queue_wait", "prefill_chunks", "shed")


def samples(metrics: MetricSet) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.exposition("text/plain")[0].decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def step(**fields: object) -> StepStats:
    base: dict[str, object] = dict(
        step=1, time_ns=0, step_time_s=0.01, batch_size=2, prefill_tokens=32, decode_tokens=1,
        num_waiting=0, num_running=2, num_preempted=0, kv_blocks_total=10, kv_blocks_free=5,
    )  # fmt: skip
    base.update(fields)
    return StepStats(**base)  # type: ignore[arg-type]


def test_scheduler_metrics_are_born_at_zero_and_count_per_tier() -> None:
    spec = SLOSpec.default()
    metrics = MetricSet(spec, "tiny", CollectorRegistry())
    before = samples(metrics)
    shed_metric = CATALOG["shed"].metric
    for tier in spec.tiers:
        assert (
            before[(CATALOG["preemptions"].metric, (("model", "tiny"), ("tier", tier.name)))] == 0
        )
        for reason in SHED_REASONS:
            key = (shed_metric, (("model", "tiny"), ("reason", reason), ("tier", tier.name)))
            assert before[key] == 0
    premium, batch = spec.tiers[0], spec.tiers[-1]
    metrics.observe_engine_step(
        step(
            prefill_chunks=3,
            preempted_by_priority={batch.priority: 2, 99: 5},  # 99: no tier, not counted
            queue_waits=((premium.priority, 0.02), (batch.priority, 1.5)),
            shed=((batch.priority, "ttft_out_of_reach"), (premium.priority, "queue_full")),
        )
    )
    after = samples(metrics)
    preempted = CATALOG["preemptions"].metric
    assert after[(preempted, (("model", "tiny"), ("tier", batch.name)))] == 2
    assert after[(preempted, (("model", "tiny"), ("tier", premium.name)))] == 0
    wait = CATALOG["scheduler_queue_wait"].metric
    assert after[(wait + "_sum", (("model", "tiny"), ("tier", batch.name)))] == 1.5
    assert after[(wait + "_count", (("model", "tiny"), ("tier", premium.name)))] == 1
    chunks = CATALOG["prefill_chunks"].metric
    assert after[(chunks + "_sum", (("model", "tiny"),))] == 3
    shed_batch = (
        shed_metric,
        (("model", "tiny"), ("reason", "ttft_out_of_reach"), ("tier", batch.name)),
    )
    shed_premium = (
        shed_metric,
        (("model", "tiny"), ("reason", "queue_full"), ("tier", premium.name)),
    )
    assert after[shed_batch] == 1 and after[shed_premium] == 1


def test_the_dashboard_has_a_tier_isolation_row_on_every_scheduler_metric() -> None:
    row = next(r for r in rows(SLOSpec.default()) if r.title.startswith("Tier isolation"))
    exprs = "\n".join(target.expr for panel in row.panels for target in panel.targets)
    for name in NAMES:
        assert CATALOG[name].metric in exprs
