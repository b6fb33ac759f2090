"""The panels of the generated dashboard, as data: titles, units and PromQL from the catalog.

Percentiles are `histogram_quantile` over `rate(<metric>_bucket[$__rate_interval])`, means
are `rate(_sum) / rate(_count)`; every query sums over replicas, so two replicas read as one
service, and filters on the dashboard's tier, model and instance variables.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slo.alert_rules import AVAILABILITY
from slo.promql import (
    ERROR_BUDGET_RECORD,
    THRESHOLD_RECORD,
    any_of,
    matcher,
    prom_duration,
    record_error_ratio,
    selector,
)
from slo.sli import CATALOG, LATENCY_SLIS, OUTCOMES_EXCLUDED_FROM_AVAILABILITY, PHASES
from slo.spec import SLOSpec

RATE = "$__rate_interval"
# One percentile panel per latency SLI that is not a phase (the phases share one stacked panel).
LATENCY_PANELS: tuple[str, ...] = tuple(name for name in LATENCY_SLIS if name not in PHASES)
QUANTILES: tuple[str, ...] = ("0.5", "0.95", "0.99")


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    unit: str
    targets: list[Target]
    stacked: bool = False
    width: int = 12


@dataclass(frozen=True)
class Row:
    title: str
    panels: list[Panel]
    # A collapsed row holds panels whose metrics only some deployments export (GPUs, prefix
    # cache, speculative decoding): they may be empty without anything being wrong.
    optional: bool = False
    notes: list[str] = field(default_factory=list)


def _request_filter(*extra: str) -> tuple[str, ...]:
    return (
        matcher("tier", "=~", "$tier"),
        matcher("model", "=~", "$model"),
        matcher("instance", "=~", "$instance"),
        *extra,
    )


def _engine_filter(*extra: str) -> tuple[str, ...]:
    return (matcher("model", "=~", "$model"), matcher("instance", "=~", "$instance"), *extra)


def _rate(metric: str, by: str = "", *matchers: str) -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({selector(metric, *matchers)}[{RATE}]))"


def quantile_expr(sli: str, quantile: str, by: str = "tier") -> str:
    metric = CATALOG[sli].metric + "_bucket"
    return f"histogram_quantile({quantile}, {_rate(metric, f'{by}, le' if by else 'le', *_request_filter())})"


def mean_expr(sli: str, by: str = "tier") -> str:
    metric = CATALOG[sli].metric
    filters = _request_filter() if "tier" in CATALOG[sli].labels else _engine_filter()
    return f"{_rate(metric + '_sum', by, *filters)}\n/\n{_rate(metric + '_count', by, *filters)}"


def _latency_panel(spec: SLOSpec, sli: str) -> Panel:
    info = CATALOG[sli]
    targets = [
        Target(quantile_expr(sli, q), f"{{{{tier}}}} p{float(q) * 100:g}") for q in QUANTILES
    ]
    if spec.thresholds_for(sli):
        line = selector(THRESHOLD_RECORD, matcher("tier", "=~", "$tier"), sli=sli)
        targets.append(Target(line, "{{tier}} SLO: {{objective}}"))
    return Panel(f"{sli.upper()} percentiles per tier", info.description, "s", targets)


def _slo_row(spec: SLOSpec) -> Row:
    tiers = matcher("tier", "=~", "$tier")
    budget = selector(ERROR_BUDGET_RECORD, tiers)
    window = prom_duration(spec.window_s)
    remaining = Panel(
        f"Error budget remaining ({window} window)",
        "1 - (bad events / events over the SLO window) / error budget, per tier and objective "
        "(recording rules). Below 0 the objective is missed.",
        "percentunit",
        [
            Target(
                f"1 - (\n{selector(record_error_ratio(spec.window_s), tiers)}\n/\n{budget}\n)",
                "{{tier}}: {{objective}}",
            )
        ],
    )
    burns = spec.alert_policy.burn_rates
    windows = (burns[0].long_window_s, burns[0].short_window_s) if burns else (spec.window_s,)
    burn = Panel(
        "Burn rate per tier",
        "Error ratio / error budget: 1 spends the budget exactly over the SLO window; the "
        "page alert fires above its factor on both windows.",
        "none",
        [
            Target(
                f"{selector(record_error_ratio(w), tiers)}\n/\n{budget}",
                f"{{{{tier}}}}: {{{{objective}}}} ({prom_duration(w)})",
            )
            for w in windows
        ],
    )
    return Row("SLOs", [remaining, burn])


def _latency_row(spec: SLOSpec) -> Row:
    panels = [_latency_panel(spec, sli) for sli in LATENCY_PANELS]
    panels.append(
        Panel(
            "TTFT vs TPOT (mean per request)",
            "Prefill-dominated first token against decode-dominated time per output token.",
            "s",
            [
                Target(mean_expr("ttft"), "{{tier}} TTFT"),
                Target(mean_expr("tpot"), "{{tier}} TPOT"),
            ],
        )
    )
    panels.append(
        Panel(
            "Latency budget: mean time per phase (stacked)",
            "The additive breakdown: network + queue + prefill + decode + detokenize + other "
            "= end-to-end. The phase that grows is the one to fix.",
            "s",
            [Target(mean_expr(phase, by=""), phase) for phase in PHASES],
            stacked=True,
        )
    )
    size = [
        Target(quantile_expr(name, q, by=""), f"{name.replace('_', ' ')} p{float(q) * 100:g}")
        for name in ("input_tokens", "output_tokens")
        for q in ("0.5", "0.95")
    ]
    panels.append(
        Panel("Request size (tokens)", "Input and output length percentiles.", "none", size)
    )
    prefill, decode = CATALOG["prefill"].metric, CATALOG["decode"].metric
    inputs, outputs = CATALOG["input_tokens"].metric, CATALOG["output_tokens"].metric
    per_token = [
        Target(
            f"{_rate(prefill + '_sum', 'tier', *_request_filter())}\n/\n{_rate(inputs + '_sum', 'tier', *_request_filter())}",
            "{{tier}} prefill per input token",
        ),
        Target(
            f"{_rate(decode + '_sum', 'tier', *_request_filter())}\n/\n{_rate(outputs + '_sum', 'tier', *_request_filter())}",
            "{{tier}} decode per output token",
        ),
    ]
    panels.append(
        Panel(
            "Latency by request length (seconds per token)",
            "Prefill time per input token and decode time per output token: how latency "
            "scales with prompt and answer length.",
            "s",
            per_token,
        )
    )
    return Row("Latency", panels)


def _traffic_row() -> Row:
    requests = CATALOG["requests"].metric
    counted = matcher("outcome", "!~", any_of(OUTCOMES_EXCLUDED_FROM_AVAILABILITY))
    failed = matcher("outcome", "!~", any_of(("ok", *OUTCOMES_EXCLUDED_FROM_AVAILABILITY)))
    all_requests = _rate(requests, "tier", *_request_filter(counted))
    error_rate = (
        f"(\n  {_rate(requests, 'tier', *_request_filter(failed))}\n  or {all_requests} * 0\n)"
        f"\n/\n{all_requests}"
    )
    tokens = CATALOG["throughput"].metric
    throughput = _rate(tokens, "", *_request_filter())
    return Row(
        "Traffic",
        [
            Panel(
                "Request rate by outcome",
                "Finished requests per second.",
                "reqps",
                [Target(_rate(requests, "outcome", *_request_filter()), "{{outcome}}")],
            ),
            Panel(
                "Error rate per tier",
                f"Failed / counted requests ({AVAILABILITY}: client "
                "errors and cancellations are not counted).",
                "percentunit",
                [Target(error_rate, "{{tier}}")],
            ),
            Panel(
                "Output throughput with capacity baseline",
                "Output tokens per second; the baseline is the highest rate of the last day.",
                "none",
                [
                    Target(throughput, "tokens/s"),
                    Target(f"max_over_time(\n{throughput}\n[1d:])", "capacity baseline (1d peak)"),
                ],
            ),
        ],
    )


def _engine_row() -> Row:
    queue_depth = CATALOG["queue_depth"].metric
    return Row(
        "Engine",
        [
            Panel(
                "Queue depth per tier",
                "Requests waiting for a batch slot.",
                "none",
                [
                    Target(
                        f"sum by (tier) ({selector(queue_depth, matcher('tier', '=~', '$tier'), *_engine_filter())})",
                        "{{tier}}",
                    )
                ],
            ),
            Panel(
                "Queue wait time",
                "Time waiting for a batch slot, preemptions included.",
                "s",
                [
                    Target(quantile_expr("queue", q), f"{{{{tier}}}} p{float(q) * 100:g}")
                    for q in ("0.5", "0.95")
                ],
            ),
            Panel(
                "Batch size and running requests per instance",
                "Sequences per scheduler step.",
                "none",
                [
                    Target(
                        f"avg by (instance) ({selector(CATALOG['batch_size'].metric, *_engine_filter())})",
                        "{{instance}} batch size",
                    ),
                    Target(
                        f"sum by (instance) ({selector(CATALOG['running'].metric, *_engine_filter())})",
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
                        f"max by (instance) ({selector(CATALOG['kv_usage'].metric, *_engine_filter())})",
                        "{{instance}}",
                    )
                ],
            ),
            Panel(
                "Cold starts",
                "Process start to ready per instance; a new point is a (re)start.",
                "s",
                [
                    Target(
                        f"max by (instance) ({selector(CATALOG['cold_start'].metric + '_sum', *_engine_filter())})",
                        "{{instance}} cold start",
                    ),
                    Target(
                        f"sum by (instance) (increase({selector(CATALOG['cold_start'].metric + '_count', *_engine_filter())}[{RATE}]))",
                        "{{instance}} starts",
                    ),
                ],
            ),
        ],
    )


def _tier_isolation_row() -> Row:
    """The engine scheduler's side of tier isolation: who was preempted, who waited, who was
    shed and why, and how finely prefill was chunked."""
    tiers = matcher("tier", "=~", "$tier")
    wait = CATALOG["scheduler_queue_wait"].metric + "_bucket"
    chunks = CATALOG["prefill_chunks"].metric
    return Row(
        "Tier isolation (engine scheduler)",
        [
            Panel(
                "Preemptions per tier",
                CATALOG["preemptions"].description,
                "ops",
                [
                    Target(
                        _rate(CATALOG["preemptions"].metric, "tier", tiers, *_engine_filter()),
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
                        f"histogram_quantile({q}, {_rate(wait, 'tier, le', tiers, *_engine_filter())})",
                        f"{{{{tier}}}} p{float(q) * 100:g}",
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
                        _rate(CATALOG["shed"].metric, "tier, reason", tiers, *_engine_filter()),
                        "{{tier}}: {{reason}}",
                    )
                ],
            ),
            Panel(
                "Prefill chunks per step",
                CATALOG["prefill_chunks"].description,
                "none",
                [
                    Target(
                        f"{_rate(chunks + '_sum', '', *_engine_filter())}\n/\n{_rate(chunks + '_count', '', *_engine_filter())}",
                        "mean",
                    ),
                    Target(
                        f"histogram_quantile(0.95, {_rate(chunks + '_bucket', 'le', *_engine_filter())})",
                        "p95",
                    ),
                ],
            ),
        ],
    )


def _optional_row() -> Row:
    def ratio(numerator: str, denominator: str) -> str:
        return f"{_rate(CATALOG[numerator].metric, '', *_engine_filter())}\n/\n{_rate(CATALOG[denominator].metric, '', *_engine_filter())}"

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
                        f"sum by (instance, gpu) ({selector(gpu_memory, *_engine_filter())})",
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
                        f"avg by (instance, gpu) ({selector(gpu_util, *_engine_filter())})",
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


def rows(spec: SLOSpec) -> list[Row]:
    return [
        _slo_row(spec),
        _latency_row(spec),
        _traffic_row(),
        _engine_row(),
        _tier_isolation_row(),
        _optional_row(),
    ]
