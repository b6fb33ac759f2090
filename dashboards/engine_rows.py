"""The engine's rows: queue, batch, KV cache and cold starts; tier isolation as the engine's
scheduler sees it; GPUs and engine features, in a collapsed row (only some deployments export
them)."""

from __future__ import annotations

from dashboards.model import Panel, Row, Target
from dashboards.queries import RATE, engine_filter, percentile_legend, quantile_expr, summed_rate
from slo.promql import matcher, selector
from slo.sli import CATALOG


def engine_row() -> Row:
    queue_depth = CATALOG["queue_depth"].metric
    tiers = matcher("tier", "=~", "$tier")
    return Row(
        "Engine",
        [
            Panel(
                "Queue depth per tier",
                "Requests waiting for a batch slot.",
                "none",
                [
                    Target(
                        f"sum by (tier) ({selector(queue_depth, tiers, *engine_filter())})",
                        "{{tier}}",
                    )
                ],
            ),
            Panel(
                "Queue wait time",
                "Time waiting for a batch slot, preemptions included.",
                "s",
                [
                    Target(quantile_expr("queue", q), percentile_legend("{{tier}}", q))
                    for q in ("0.5", "0.95")
                ],
            ),
            Panel(
                "Batch size and running requests per instance",
                "Sequences per scheduler step.",
                "none",
                [
                    Target(
                        "avg by (instance) "
                        f"({selector(CATALOG['batch_size'].metric, *engine_filter())})",
                        "{{instance}} batch size",
                    ),
                    Target(
                        "sum by (instance) "
                        f"({selector(CATALOG['running'].metric, *engine_filter())})",
                        "{{instance}} running",
                    ),
                ],
            ),
            Panel(
                "KV-cache usage per instance",
                "Fraction of KV-cache blocks in use; near 1 means preemptions and OOM risk.",
                "percentunit",
                [
                    Target(
                        "max by (instance) "
                        f"({selector(CATALOG['kv_usage'].metric, *engine_filter())})",
                        "{{instance}}",
                    )
                ],
            ),
            _cold_start_panel(),
        ],
    )


def _cold_start_panel() -> Panel:
    cold_start = CATALOG["cold_start"].metric
    return Panel(
        "Cold starts",
        "Process start to ready per instance; a new point is a (re)start.",
        "s",
        [
            Target(
                f"max by (instance) ({selector(cold_start + '_sum', *engine_filter())})",
                "{{instance}} cold start",
            ),
            Target(
                "sum by (instance) "
                f"(increase({selector(cold_start + '_count', *engine_filter())}[{RATE}]))",
                "{{instance}} starts",
            ),
        ],
    )


def tier_isolation_row() -> Row:
    """The engine scheduler's side of tier isolation: who was preempted, who waited, who was
    shed and why, and how finely prefill was chunked."""
    tiers = matcher("tier", "=~", "$tier")
    wait = CATALOG["scheduler_queue_wait"].metric + "_bucket"
    return Row(
        "Tier isolation (engine scheduler)",
        [
            Panel(
                "Preemptions per tier",
                CATALOG["preemptions"].description,
                "ops",
                [
                    Target(
                        summed_rate(CATALOG["preemptions"].metric, "tier", tiers, *engine_filter()),
                        "{{tier}}",
                    )
                ],
            ),
            Panel(
                "Scheduler queue wait per tier",
                CATALOG["scheduler_queue_wait"].description,
                "s",
                [
                    Target(
                        f"histogram_quantile({q}, "
                        f"{summed_rate(wait, 'tier, le', tiers, *engine_filter())})",
                        percentile_legend("{{tier}}", q),
                    )
                    for q in ("0.5", "0.95")
                ],
            ),
            Panel(
                "Shed requests per tier and reason",
                CATALOG["shed"].description,
                "reqps",
                [
                    Target(
                        summed_rate(
                            CATALOG["shed"].metric, "tier, reason", tiers, *engine_filter()
                        ),
                        "{{tier}}: {{reason}}",
                    )
                ],
            ),
            _prefill_chunks_panel(),
        ],
    )


def _prefill_chunks_panel() -> Panel:
    chunks = CATALOG["prefill_chunks"].metric
    return Panel(
        "Prefill chunks per step",
        CATALOG["prefill_chunks"].description,
        "none",
        [
            Target(
                f"{summed_rate(chunks + '_sum', '', *engine_filter())}\n/\n"
                f"{summed_rate(chunks + '_count', '', *engine_filter())}",
                "mean",
            ),
            Target(
                "histogram_quantile(0.95, "
                f"{summed_rate(chunks + '_bucket', 'le', *engine_filter())})",
                "p95",
            ),
        ],
    )


def optional_row() -> Row:
    def ratio(numerator: str, denominator: str) -> str:
        return (
            f"{summed_rate(CATALOG[numerator].metric, '', *engine_filter())}\n/\n"
            f"{summed_rate(CATALOG[denominator].metric, '', *engine_filter())}"
        )

    gpu_memory, gpu_util = CATALOG["gpu_memory"].metric, CATALOG["gpu_utilization"].metric
    return Row(
        "GPUs and engine features (when exported)",
        [
            Panel(
                "GPU memory per instance",
                "Memory in use per GPU.",
                "bytes",
                [
                    Target(
                        f"sum by (instance, gpu) ({selector(gpu_memory, *engine_filter())})",
                        "{{instance}} gpu {{gpu}}",
                    )
                ],
            ),
            Panel(
                "GPU utilization per instance",
                "Compute utilization per GPU.",
                "percentunit",
                [
                    Target(
                        f"avg by (instance, gpu) ({selector(gpu_util, *engine_filter())})",
                        "{{instance}} gpu {{gpu}}",
                    )
                ],
            ),
            Panel(
                "Prefix-cache hit rate",
                "Prompt tokens served from the prefix cache.",
                "percentunit",
                [Target(ratio("prefix_cache_hits", "prefix_cache_queries"), "hit rate")],
            ),
            Panel(
                "Speculative-decoding acceptance",
                "Draft tokens accepted by the target model.",
                "percentunit",
                [
                    Target(
                        ratio("spec_decode_accepted_tokens", "spec_decode_draft_tokens"),
                        "acceptance",
                    )
                ],
            ),
        ],
        optional=True,
    )
