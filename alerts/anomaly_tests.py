"""promtool tests that an anomaly widens its window at low traffic instead of going silent.

For the first tier that watches the prefill mean, one group per traffic level: steady
requests and a steady prefill mean from t=0, the band warmed up (`WARM_UP_S`), then at S the
prefill mean doubles:

    steady traffic, prefill at its usual mean ........ | prefill 2x
    0                                                  S          check

| case | requests per minute (`min_requests` 100) | the tier's window | what the check sees |
|---|---|---|---|
| 5m | 2/5 of the minimum (40: 200 in 5m) | 5m | the prefill info at S + 5m + `for`, as before |
| 30m | 12 (0.2/s: 60 in 5m, 360 in 30m) | 30m | the prefill info by S + 30m |
| 1h | 1/50 of the minimum (2: 120 in 1h) | 1h | the prefill info by S + 30m |
| quiet | 1/150 of the minimum (40 in 1h) | none | no window, no signal, nothing fires |

The info alert is `LLMSLOAnomaly{anomaly="prefill_mean", phase="prefill"}` with its
annotations as Alertmanager shows them (the window's minutes filled in); at S nothing fires,
and the tier's window (`llm_slo_tier:anomaly_window:minutes`) is the case's. The 5m check
comes before a 30m window could have fired (its mean is 1.33x the usual at S + 10m), so the
5m case fails rules that widen at normal traffic; the 30m and 1h cases fail rules that keep
the 5m guard (before the windows widened, both were silent). The quiet case needs no day:
two hours in, with fewer than the minimum in every hour, the tier has no window and no
signal, so no band can form and no anomaly fire. The 30m case keeps 0.2 requests/s while
that falls between the 5m and 30m counts of the spec's minimum, else takes 1/12 of it.

Each group needs a day of samples, so these groups have their own file
(`prometheus/anomaly_rules_test.yml`), evaluated every `EVALUATION_S` (5m) whatever the
spec's windows: on the grid of a spec with 2-minute burn windows (`rules_test.yml`'s, 1m)
a day would cost 1440 evaluations of every rule instead of 288.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from alerts.anomalies import ALERT_NAME, anomaly_annotations, anomaly_labels, watched
from alerts.anomaly_windows import WINDOWS_S, minutes
from alerts.rule_types import GOOD_OUTCOME, REQUESTS, Links
from alerts.rules import group_order
from alerts.templating import render
from slo.promql import ANOMALY_SIGNAL_RECORD, ANOMALY_WINDOW_RECORD, prom_duration, selector
from slo.sli import CATALOG
from slo.spec import SLOSpec

SIGNAL = "prefill_mean"
PREFILL_MEAN_S = 0.05
SLOWDOWN = 2.0
EVALUATION_S = 300.0
WARM_UP_S = 22 * 3600.0  # the band's day: 130 of 144 ten-minute points (21h40m), and some
LOW_TRAFFIC_CHECK_S = 1800.0  # the widened windows' promise: the info within 30 minutes
QUIET_S = 2 * 3600.0  # the quiet case: two hours, each with too few requests
_SAMPLE_S = 60.0
_MODEL = "test-model"
_ROUTE = "/v1/completions"
_PER_SECOND_30M = 0.2  # the quietest hour of the issue that asked for wider windows


@dataclass(frozen=True)
class Case:
    name: str
    per_minute: float
    window_s: float | None  # the tier's anomaly window; None: too few requests for any
    start_s: float  # S, when prefill slows
    check_s: float  # after S


def cases(spec: SLOSpec) -> list[Case]:
    """The traffic levels, each with the window it must read and when the info must fire."""
    policy = spec.alert_policy.anomalies
    least = policy.min_requests
    at_5m = 5 * _PER_SECOND_30M * 60
    per_minute_30m = _PER_SECOND_30M * 60 if at_5m < least <= 0.9 * 6 * at_5m else least / 12
    start = _on_grid(WARM_UP_S)
    # At S + 5m the 5m mean is all slow; the alert fires `for` later.
    fast = _on_grid(WINDOWS_S[0] + policy.for_s)
    # The 1h mean crosses the band's floor after min_band of the hour; then `for`, two steps.
    slow = _on_grid(WINDOWS_S[-1] * policy.min_band + policy.for_s + 2 * EVALUATION_S)
    slow = max(slow, _on_grid(LOW_TRAFFIC_CHECK_S))
    return [
        Case("5m", least * 2 / 5, WINDOWS_S[0], start, fast),
        Case("30m", per_minute_30m, WINDOWS_S[1], start, slow),
        Case("1h", least / 50, WINDOWS_S[2], start, slow),
        Case("quiet", least / 150, None, _on_grid(QUIET_S / 2), _on_grid(QUIET_S / 2)),
    ]


def _on_grid(seconds: float) -> float:
    return EVALUATION_S * math.ceil(seconds / EVALUATION_S)


def _values(increments: list[float]) -> str:
    total, values = 0.0, ["0"]
    for increment in increments:
        total += increment
        values.append(format(round(total, 9), ".12g"))
    return " ".join(values)


def _series(tier: str, case: Case, steps: int) -> list[dict[str, str]]:
    labels = f'tier="{tier}", model="{_MODEL}", route="{_ROUTE}"'
    metric = CATALOG["prefill"].metric
    slow_from = round(case.start_s / _SAMPLE_S)
    prefill = [
        case.per_minute * PREFILL_MEAN_S * (SLOWDOWN if step >= slow_from else 1.0)
        for step in range(steps)
    ]
    requests = _values([case.per_minute] * steps)
    return [
        {"series": f'{REQUESTS}{{{labels}, outcome="{GOOD_OUTCOME}"}}', "values": requests},
        {"series": f"{metric}_count{{{labels}}}", "values": requests},
        {"series": f"{metric}_sum{{{labels}}}", "values": _values(prefill)},
    ]


def _expected(
    spec: SLOSpec, links: Links, tier: str, case: Case
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The alerts firing at the check, and the tier's window at S, as promtool expects."""
    if case.window_s is None:
        return [], []
    window = minutes(case.window_s)
    shown = anomaly_annotations(spec, tier, SIGNAL, links, window_shown=window)
    fired = [{"exp_labels": anomaly_labels(tier, SIGNAL), "exp_annotations": shown}]
    return fired, [{"labels": selector(ANOMALY_WINDOW_RECORD, tier=tier), "value": window}]


def _group(spec: SLOSpec, links: Links, tier: str, case: Case) -> dict[str, Any]:
    check_s = case.start_s + case.check_s
    fired, windows = _expected(spec, links, tier, case)
    at_start, at_check = prom_duration(case.start_s), prom_duration(check_s)
    exprs = [{"expr": selector(ANOMALY_WINDOW_RECORD, tier=tier), "at": at_start, "exp": windows}]
    if case.window_s is None:  # no window, no signal: nothing a band could form from
        signal = selector(ANOMALY_SIGNAL_RECORD, tier=tier)
        exprs.append({"expr": signal, "at": at_check, "exp": []})
    return {
        "name": f"{tier} anomaly at {case.per_minute / 60:.3g} requests/s: prefill "
        f"{SLOWDOWN:g}x, window {case.name}",
        "interval": prom_duration(_SAMPLE_S),
        "input_series": _series(tier, case, math.ceil(check_s / _SAMPLE_S) + 1),
        "alert_rule_test": [
            {"eval_time": at_start, "alertname": ALERT_NAME, "exp_alerts": []},
            {"eval_time": at_check, "alertname": ALERT_NAME, "exp_alerts": fired},
        ],
        "promql_expr_test": [
            {"expr": e["expr"], "eval_time": e["at"], "exp_samples": e["exp"]} for e in exprs
        ],
    }


def anomaly_groups(spec: SLOSpec, links: Links) -> list[dict[str, Any]]:
    """One promtool test group per case, for the first tier watching the prefill mean."""
    tiers = [tier.name for tier in spec.tiers if SIGNAL in watched(spec, tier)]
    if not tiers:
        return []
    return [_group(spec, links, tiers[0], case) for case in cases(spec)]


def render_anomaly_test(spec: SLOSpec, links: Links, rules_file: str, test_file: str) -> str:
    """The promtool file `test_file` of the anomaly groups, testing `rules_file` (no groups
    when no tier watches the prefill mean)."""
    return render(
        "rules_test.yml.j2",
        rules_file=rules_file,
        test_file=test_file,
        evaluation_interval=prom_duration(EVALUATION_S),
        group_eval_order=group_order(spec),
        groups=anomaly_groups(spec, links),
        source=spec.source,
    )
