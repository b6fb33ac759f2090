"""Anomaly bands: `severity: info` alerts for signals without a fixed threshold.

Per tier, each signal of `slo.spec.anomaly_policy.ANOMALY_SIGNALS` the spec watches is
recorded every evaluation over the tier's anomaly window (`llm_slo_tier:anomaly_signal:widened`,
label `anomaly`): the last 5 minutes, or at low traffic the narrowest of 30m and 1h that holds
`min_requests` requests (`alerts.anomaly_windows`); with fewer in the last hour, no signal.
Its band is built from that recorded series only, never from raw ones:

- centre: with a week of history, GitLab's seasonal prediction (the same hour last week,
  shifted by how much today's level differs from last week's day):
  `avg_over_time(s[1h:10m] offset 1w-30m) + m - m offset 1w`, where `m` is the day's mean
  `avg_over_time(s[1d:10m])`, recorded (`llm_slo_tier:anomaly_signal:avg1d`) so that the
  centre reads it now and a week later instead of stepping through both days again; before
  that, `m` alone (grafana/promql-anomaly-detection's adaptive band);
- half-width: `sigmas` standard deviations of what the centre fails to explain (the
  residual against last week, or the last day's spread), and at least `min_band` of the
  centre, so a flat signal's tiny noise never makes a band of zero width;
- warm-up: `m` is recorded only once the signal has ~22h of history (130 of 144 ten-minute
  points, a point where the tier had no window counting as one): no band before, and no
  seasonal centre before `m` was recorded a week ago.

Subqueries step by 10 minutes: a day of history is 144 samples per series, whatever the
scrape interval or the fleet's size; four of them per tier (the day's mean, its count, its
spread, the residual against last week), the seasonal hour's six, and two over one series
per tier (the warm-up's points without a window). The signals, bands and
alerts live in the tier's slow group (`alerts.rules`, every minute): a band moves by 10-minute
steps, and a 5-minute signal checked every minute still raises the alert within its `for`
and a minute. The alert fires when the
signal leaves the band (latency, error ratio and phase means: above; request rate: either
side) for `for`; the guard is the signal's own (no window, no signal); an error ratio must
also be above 1%: a band around 0 is not news at 0.5%.
"""

from __future__ import annotations

from functools import partial

from alerts.anomaly_windows import (
    WINDOWS_S,
    phase_mean_records,
    request_records,
    widened,
    window_rule,
)
from alerts.phases import join_phase, phase_annotation
from alerts.quantiles import quantile_expr
from alerts.rule_types import GOOD_OUTCOME, REQUESTS, Links, Rule
from slo.alert_rules import PHASE_LABEL, URGENCY, URGENCY_LABEL
from slo.promql import (
    ANOMALY_CENTER_RECORD,
    ANOMALY_LOWER_RECORD,
    ANOMALY_SIGNAL_RECORD,
    ANOMALY_UPPER_RECORD,
    ANOMALY_WIDTH_RECORD,
    ANOMALY_WINDOW_RECORD,
    REQUESTS_5M_RECORD,
    any_of,
    matcher,
    number,
    phase_mean_record,
    prom_duration,
    requests_record,
    selector,
)
from slo.sli import OUTCOMES_EXCLUDED_FROM_AVAILABILITY, PHASES
from slo.spec import SLOSpec, Tier
from slo.spec.anomaly_policy import ANOMALY_SIGNALS, LATENCY_SIGNALS, AnomalyPolicy
from slo.units import format_duration

ANOMALY_LABEL = "anomaly"
ALERT_NAME = "LLMSLOAnomaly"
STEP = "10m"
WARM_UP_POINTS = 130  # of 144 ten-minute points in a day
ERROR_RATIO_FLOOR = 0.01
TWO_SIDED = ("request_rate",)
_WEEK_S = 7 * 86400
SIGNAL_WINDOW_S = 300.0  # a signal is its value over the last 5 minutes
ANOMALY_MEAN_RECORD = "llm_slo_tier:anomaly_signal:avg1d"  # read here and by the benchmark


def signal_expr(tier: str, signal: str, window_s: float = SIGNAL_WINDOW_S) -> str:
    """PromQL of one signal over the window (one of `alerts.anomaly_windows.WINDOWS_S`)."""
    if signal in LATENCY_SIGNALS:
        return quantile_expr(0.95, tier, signal.removesuffix("_p95"), window_s)
    if signal == "request_rate":
        return f"{selector(requests_record(window_s), tier=tier)} / {number(window_s)}"
    window = prom_duration(window_s)
    if signal == "error_ratio":
        counted = matcher("outcome", "!~", any_of(OUTCOMES_EXCLUDED_FROM_AVAILABILITY))
        bad = matcher("outcome", "!~", any_of((GOOD_OUTCOME, *OUTCOMES_EXCLUDED_FROM_AVAILABILITY)))
        return (
            f"(sum(rate({selector(REQUESTS, bad, tier=tier)}[{window}])) or vector(0))\n/\n"
            f"sum(rate({selector(REQUESTS, counted, tier=tier)}[{window}]))"
        )
    phase = signal.removesuffix("_mean")
    return f"sum({selector(phase_mean_record(window_s), tier=tier, phase=phase)})"


def phase_signals_expr(tier: str, phases: list[str], window_s: float = SIGNAL_WINDOW_S) -> str:
    """Every watched phase mean over the window as its signal in one rule (labelled tier and
    anomaly `<phase>_mean`), the series and values one rule per phase would give: a rule
    costs a cycle about the same whatever it reads."""
    record = phase_mean_record(window_s)
    means = selector(record, matcher(PHASE_LABEL, "=~", any_of(phases)), tier=tier)
    named = f'label_replace({means}, "{ANOMALY_LABEL}", "${{1}}_mean", "{PHASE_LABEL}", "(.*)")'
    return f"sum without ({PHASE_LABEL}) ({named})"


def signal_quantiles(spec: SLOSpec, tier: Tier) -> set[tuple[str, float]]:
    """The (SLI, window) bucket rates the tier's latency signals read (`alerts.quantiles`)."""
    latency = [s for s in watched(spec, tier) if s in LATENCY_SIGNALS]
    return {(s.removesuffix("_p95"), window) for s in latency for window in WINDOWS_S}


def _band_rules(tier: str, policy: AnomalyPolicy) -> list[Rule]:
    own = {"tier": tier}
    s = selector(ANOMALY_SIGNAL_RECORD, tier=tier)
    day = f"[1d:{STEP}]"
    # The day's mean, only once the day is (nearly) whole: recorded, so the centre, the width
    # and next week's seasonal centre read it rather than step through the day again. A point
    # where the tier had too few requests for any window counts as seen: a tier quiet every
    # night still gets its band.
    quiet = (
        f"count_over_time({selector(REQUESTS_5M_RECORD, **own)}{day})\n- on (tier)\n"
        f"count_over_time({selector(ANOMALY_WINDOW_RECORD, **own)}{day})"
    )
    seen = f"count_over_time({s}{day})\n+ on (tier) group_left ()\n(\n{quiet}\n)"
    mean = f"avg_over_time({s}{day})\nand\n{seen}\n>= {WARM_UP_POINTS}"
    m = selector(ANOMALY_MEAN_RECORD, tier=tier)
    # Last week counts only once a whole day of it existed (its mean was recorded): a partial
    # day's mean is biased.
    last_week = f"{m} offset 1w"
    seasonal = (
        f"avg_over_time({s}[1h:{STEP}] offset {prom_duration(_WEEK_S - 1800)})\n"
        f"+ {m}\n- {last_week}"
    )
    center = f"(\n{seasonal}\n)\nor\n{m}"
    residual = f"stddev_over_time(({s} - {s} offset 1w){day})\nand {last_week}"
    c = selector(ANOMALY_CENTER_RECORD, tier=tier)
    spread = f"{number(policy.sigmas)} * ({residual} or stddev_over_time({s}{day}))"
    floor = f"{number(policy.min_band)} * abs({c})"
    width = f"(\n{spread}\n> {floor}\n)\nor\n{floor}"
    w = selector(ANOMALY_WIDTH_RECORD, tier=tier)
    return [
        Rule(mean, record=ANOMALY_MEAN_RECORD, labels=own),
        Rule(center, record=ANOMALY_CENTER_RECORD, labels=own),
        Rule(width, record=ANOMALY_WIDTH_RECORD, labels=own),
        Rule(f"{c} + {w}", record=ANOMALY_UPPER_RECORD, labels=own),
        Rule(f"{c} - {w}", record=ANOMALY_LOWER_RECORD, labels=own),
    ]


def watched(spec: SLOSpec, tier: Tier) -> list[str]:
    return [s for s in ANOMALY_SIGNALS if spec.alert_policy.anomalies.watches(tier.name, s)]


def anomaly_records(spec: SLOSpec, tier: Tier) -> list[Rule]:
    """The tier's request counts and anomaly window, its signals over that window and its
    bands (after the phase records)."""
    signals = watched(spec, tier)
    if not signals:
        return []
    name, policy = tier.name, spec.alert_policy.anomalies
    phases = [s.removesuffix("_mean") for s in signals if anomaly_phase(s)]
    rules = [*request_records(name), window_rule(name, policy.min_requests)]
    if phases:
        rules += phase_mean_records(name, phases)
    rules += [
        Rule(
            widened(name, partial(signal_expr, name, s)),
            record=ANOMALY_SIGNAL_RECORD,
            labels=_labels(tier, s),
        )
        for s in signals
        if not anomaly_phase(s)
    ]
    if phases:
        merged = widened(name, partial(phase_signals_expr, name, phases))
        rules.append(Rule(merged, record=ANOMALY_SIGNAL_RECORD, labels={"tier": name}))
    return rules + _band_rules(name, policy)


def _labels(tier: Tier, signal: str) -> dict[str, str]:
    return {"tier": tier.name, ANOMALY_LABEL: signal}


def anomaly_condition(tier: str, signal: str) -> str:
    """Outside the band: a series labelled tier and anomaly. The guard is the signal's own:
    it exists only while a window holds the minimum requests (`alerts.anomaly_windows`)."""
    labels = {"tier": tier, ANOMALY_LABEL: signal}
    s, upper = selector(ANOMALY_SIGNAL_RECORD, **labels), selector(ANOMALY_UPPER_RECORD, **labels)
    out = f"{s} > {upper}"
    if signal in TWO_SIDED:
        out = f"{out}\nor\n{s} < {selector(ANOMALY_LOWER_RECORD, **labels)}"
    if signal == "error_ratio":
        out = f"({out}) > {number(ERROR_RATIO_FLOOR)}"
    return out


def anomaly_phase(signal: str) -> str | None:
    """The phase an anomaly names statically (a phase's own mean), else None."""
    phase = signal.removesuffix("_mean")
    return phase if signal.endswith("_mean") and phase in PHASES else None


def anomaly_expr(spec: SLOSpec, tier: str, signal: str) -> str:
    """The alert's PromQL: latency signals join the phase blamed for their SLI."""
    condition = anomaly_condition(tier, signal)
    if signal in LATENCY_SIGNALS:
        return join_phase(tier, signal.removesuffix("_p95"), condition)
    return condition


def anomaly_labels(tier: str, signal: str) -> dict[str, str]:
    """The alert rule's static labels (a latency signal's `phase` comes from its expression)."""
    labels = {"severity": "info", URGENCY_LABEL: URGENCY["info"], "tier": tier}
    labels[ANOMALY_LABEL] = signal
    phase = anomaly_phase(signal)
    return {**labels, PHASE_LABEL: phase} if phase else labels


_WHAT = {
    "ttft_p95": "p95 time to first token",
    "tpot_p95": "p95 time per output token",
    "e2e_p95": "p95 end-to-end latency",
    "error_ratio": "error ratio",
    "request_rate": "request rate",
}


def _what(signal: str) -> str:
    phase = anomaly_phase(signal)
    return f"mean {phase} time" if phase else _WHAT[signal]


def window_annotation() -> str:
    """The tier's anomaly window now, in minutes, as a Go template of the alert."""
    query = f'printf "{ANOMALY_WINDOW_RECORD}{{tier=%q}}" $labels.tier'
    return f'{{{{ with query ({query}) }}}}{{{{ . | first | value | printf "%.0f" }}}}{{{{ end }}}}'


def anomaly_annotations(
    spec: SLOSpec,
    tier: str,
    signal: str,
    links: Links,
    phase_shown: str | None = None,
    window_shown: int | None = None,
) -> dict[str, str]:
    """summary, description, links, and for a latency signal the `phase` annotation: their
    templates, or with `phase_shown` and `window_shown` (the window's minutes) the text
    Alertmanager shows (promtool tests expect it)."""
    policy = spec.alert_policy.anomalies
    side = "outside" if signal in TWO_SIDED else "above"
    window = window_annotation() if window_shown is None else str(window_shown)
    widths = ", ".join(prom_duration(w) for w in WINDOWS_S[:-1])
    annotations = {
        "summary": f"Tier {tier}: the {_what(signal)} left its usual band",
        "description": f"Over the last {window} minutes (the narrowest of {widths} and "
        f"{prom_duration(WINDOWS_S[-1])} with at least {policy.min_requests} requests) the "
        f"{_what(signal)} of tier {tier} has been {side} its band for "
        f"{format_duration(policy.for_s)}: the same hour last week adjusted to today's level "
        f"(or, in the first week, the last day's mean), plus or minus "
        f"{number(policy.sigmas)} standard deviations and at least "
        f"{number(policy.min_band * 100)}%. Informational: no error budget is at risk yet. "
        f"Fewer than {policy.min_requests} requests in the last "
        f"{prom_duration(WINDOWS_S[-1])} never alert.",
        "runbook_url": f"{links.runbook_base.rstrip('/')}/{ALERT_NAME}.md",
        "dashboard_url": f"{links.dashboard}?var-tier={tier}",
    }
    if signal in LATENCY_SIGNALS:
        annotations["phase"] = phase_annotation() if phase_shown is None else phase_shown
    return annotations


def anomaly_alerts(spec: SLOSpec, tier: Tier, links: Links) -> list[Rule]:
    """One info alert per watched signal of the tier."""
    return [
        Rule(
            anomaly_expr(spec, tier.name, signal),
            alert=ALERT_NAME,
            for_=prom_duration(spec.alert_policy.anomalies.for_s),
            labels=anomaly_labels(tier.name, signal),
            annotations=anomaly_annotations(spec, tier.name, signal, links),
        )
        for signal in watched(spec, tier)
    ]
