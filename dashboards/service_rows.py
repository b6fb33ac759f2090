"""The service's rows: SLOs (error budget, burn rates), latency (a percentile panel per latency
SLI, the phase budget, request size) and traffic (rates, errors, throughput)."""

from __future__ import annotations

from dashboards.model import Panel, Row, Target
from dashboards.queries import (
    QUANTILES,
    mean_expr,
    percentile_legend,
    phase_mean_expr,
    quantile_expr,
    request_filter,
    summed_rate,
)
from slo.alert_rules import AVAILABILITY, GOODPUT
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

# One percentile panel per latency SLI that is not a phase (the phases share one stacked panel).
LATENCY_PANELS: tuple[str, ...] = tuple(name for name in LATENCY_SLIS if name not in PHASES)


def _latency_panel(spec: SLOSpec, sli: str) -> Panel:
    info = CATALOG[sli]
    targets = [Target(quantile_expr(sli, q), percentile_legend("{{tier}}", q)) for q in QUANTILES]
    if spec.thresholds_for(sli):
        line = selector(THRESHOLD_RECORD, matcher("tier", "=~", "$tier"), sli=sli)
        targets.append(Target(line, "{{tier}} SLO: {{objective}}"))
    return Panel(f"{sli.upper()} percentiles per tier", info.description, "s", targets)


def slo_row(spec: SLOSpec) -> Row:
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
    return Row("SLOs", [remaining, burn, _goodput_panel(spec)])


def _goodput_panel(spec: SLOSpec) -> Panel:
    """Good requests over counted ones per tier, and each goodput objective's target."""
    counted = matcher("outcome", "!~", any_of(OUTCOMES_EXCLUDED_FROM_AVAILABILITY))
    good = summed_rate(CATALOG["good_requests"].metric, "tier", *request_filter())
    events = summed_rate(CATALOG["requests"].metric, "tier", *request_filter(counted))
    targets = [Target(f"{good}\n/\n{events}", "{{tier}}")]
    if any(o.kind == GOODPUT for tier in spec.tiers for o in tier.objectives):
        budget = selector(ERROR_BUDGET_RECORD, matcher("tier", "=~", "$tier"), sli=GOODPUT)
        targets.append(Target(f"1 - {budget}", "{{tier}} SLO: {{objective}}"))
    return Panel(
        "Goodput per tier",
        "Requests that were ok and met every per-request latency objective of their tier, "
        "over the requests availability counts (client errors and cancellations left out): "
        "the goodput `slo check` judges.",
        "percentunit",
        targets,
    )


def _per_token_panel() -> Panel:
    prefill, decode = CATALOG["prefill"].metric, CATALOG["decode"].metric
    inputs, outputs = CATALOG["input_tokens"].metric, CATALOG["output_tokens"].metric

    def ratio(numerator: str, denominator: str) -> str:
        over = summed_rate(denominator + "_sum", "tier", *request_filter())
        return f"{summed_rate(numerator + '_sum', 'tier', *request_filter())}\n/\n{over}"

    return Panel(
        "Latency by request length (seconds per token)",
        "Prefill time per input token and decode time per output token: how latency "
        "scales with prompt and answer length.",
        "s",
        [
            Target(ratio(prefill, inputs), "{{tier}} prefill per input token"),
            Target(ratio(decode, outputs), "{{tier}} decode per output token"),
        ],
    )


def latency_row(spec: SLOSpec) -> Row:
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
            [Target(phase_mean_expr(phase), phase) for phase in PHASES],
            stacked=True,
        )
    )
    size = [
        Target(quantile_expr(name, q, by=""), percentile_legend(name.replace("_", " "), q))
        for name in ("input_tokens", "output_tokens")
        for q in ("0.5", "0.95")
    ]
    panels.append(
        Panel("Request size (tokens)", "Input and output length percentiles.", "none", size)
    )
    panels.append(_per_token_panel())
    return Row("Latency", panels)


def traffic_row() -> Row:
    requests = CATALOG["requests"].metric
    counted = matcher("outcome", "!~", any_of(OUTCOMES_EXCLUDED_FROM_AVAILABILITY))
    failed = matcher("outcome", "!~", any_of(("ok", *OUTCOMES_EXCLUDED_FROM_AVAILABILITY)))
    all_requests = summed_rate(requests, "tier", *request_filter(counted))
    error_rate = (
        f"(\n  {summed_rate(requests, 'tier', *request_filter(failed))}\n  or {all_requests} * 0\n)"
        f"\n/\n{all_requests}"
    )
    throughput = summed_rate(CATALOG["throughput"].metric, "", *request_filter())
    return Row(
        "Traffic",
        [
            Panel(
                "Request rate by outcome",
                "Finished requests per second.",
                "reqps",
                [Target(summed_rate(requests, "outcome", *request_filter()), "{{outcome}}")],
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
