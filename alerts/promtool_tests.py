"""promtool unit tests generated with the rules: every alert fires on a breach and stays
silent on healthy traffic and on low traffic (the guard), for every tier and SLI of the spec.

Per (tier, SLI) three test groups feed synthetic series of that SLI only:
- breach: every observation above the highest bucket (or every request failed; for goodput,
  every request ok and none good), at a rate that satisfies the low-traffic guard; every
  alert of that tier and SLI must fire, with its exact labels and annotations;
- healthy: every observation in the lowest bucket (or every request ok, with client errors
  and cancellations on top, which availability leaves out; for goodput, every ok request
  also good); nothing fires;
- low traffic: all bad, but so few events that every window holds fewer than `min_events`
  even after Prometheus extrapolates `increase()`; nothing fires.
Plus the absent-metrics alert, firing without series and silent with them; the burn-rate
groups of `alerts.burn_tests`, which prove each burn-rate rule of every tier and objective
(its factor, its windows, page against ticket, that it resolves, its guard); and the phase
groups of `alerts.phase_tests`.

Series get a sample every `evaluation_interval_s` (<= 1m); rules are evaluated on a coarser
grid (`rule_evaluation_s`, the common divisor of the policy's long windows and the tiles,
5m by default): `increase()` reads the raw samples whatever the grid, and 7 hours of test
cost 84 rule evaluations instead of 420.

Rates are evaluated on data that starts at time 0, so no test needs days of samples: every
window, even 3d, sees the same all-bad (or all-good) traffic after the first samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from alerts.burn_tests import Timing, burn_groups
from alerts.phase_tests import phase_groups
from alerts.policy_tests import expected_alerts
from alerts.records import recorded_windows, tile_of
from alerts.rule_types import GOOD_REQUESTS
from alerts.rules import GOOD_OUTCOME, REQUESTS, Links, group_order
from alerts.templating import render
from slo.alert_rules import AVAILABILITY, GOODPUT, AlertRule, alert_rules, windows_s
from slo.promql import le_value, prom_duration
from slo.sli import CATALOG, OUTCOMES_EXCLUDED_FROM_AVAILABILITY, buckets_for
from slo.spec import SLOSpec

# Any model/route: the rules sum over them, so one of each is enough.
_MODEL = "test-model"
_ROUTE = "/v1/completions"
# Extrapolation of increase() over a window of >= 5 sample intervals is at most 5/4.
_SAMPLES_PER_SHORTEST_WINDOW = 5
_MAX_EXTRAPOLATION = 1.25


@dataclass(frozen=True)
class Series:
    series: str
    values: str


def _labels(**labels: str) -> str:
    return "{" + ", ".join(f'{key}="{value}"' for key, value in labels.items()) + "}"


def _ramp(per_step: int, steps: int) -> str:
    return f"0+{per_step}x{steps}"


def _ramp_then_flat(total: int, steps: int) -> str:
    """+1 per step until `total`, then flat: a trickle of events."""
    if total <= 0:
        return f"0+0x{steps}"
    return f"0+1x{total} {total}+0x{steps - total}"


def evaluation_interval_s(spec: SLOSpec) -> float:
    """Five samples in the shortest window alerts read, at most one a minute."""
    shortest = min(windows_s(spec))
    return max(1.0, min(60.0, math.floor(shortest / _SAMPLES_PER_SHORTEST_WINDOW)))


def rule_evaluation_s(spec: SLOSpec) -> float:
    """How often promtool evaluates the rules: every check time of the tests is on this grid,
    and every tile a window adds up is recorded on it (a 5-minute tile every 5 minutes)."""
    sample = round(evaluation_interval_s(spec))
    grid = 0
    for rule in spec.alert_policy.burn_rates:
        grid = math.gcd(grid, round(rule.long_window_s))
    for tile in {tile_of(window) for window in recorded_windows(windows_s(spec))} - {None}:
        grid = math.gcd(grid, round(tile or 0))
    return float(grid) if grid and grid % sample == 0 else float(sample)


def check_grid_s(spec: SLOSpec) -> float:
    """Where the tests check: on the evaluation grid and on every tile's (whole hours when a
    window adds hourly tiles), where a sum of tiles counts what `increase()` does."""
    grid = round(rule_evaluation_s(spec))
    for tile in {tile_of(window) for window in recorded_windows(windows_s(spec))} - {None}:
        grid = math.lcm(grid, round(tile or 0))
    return float(grid)


def burn_timing(spec: SLOSpec) -> Timing:
    """The samples, evaluations and checks of the generated burn-rate groups."""
    return Timing(evaluation_interval_s(spec), rule_evaluation_s(spec), check_grid_s(spec))


def _on_grid(seconds: float, grid: float) -> float:
    return grid * math.ceil(seconds / grid)


def _latency_series(
    spec: SLOSpec, tier: str, sli: str, case: str, steps: int, rate: int, low: int
) -> list[Series]:
    metric = CATALOG[sli].metric
    base = {"tier": tier, "model": _MODEL, "route": _ROUTE}
    all_events = _ramp(rate, steps) if case != "low" else _ramp_then_flat(low, steps)
    # Healthy traffic sits exactly on the tightest threshold: a value equal to the threshold is
    # good, so a rule reading the wrong bucket, or a percentile threshold off by one bucket,
    # fires here. Bad traffic lies above every bucket.
    tightest = min(
        (o.threshold_s or 0.0 for o in spec.tier(tier).latency_objectives if o.sli == sli),
        default=0.0,
    )
    series = [
        Series(
            f"{metric}_bucket{_labels(**base, le=le_value(bound))}",
            all_events if case == "healthy" and bound >= tightest else _ramp(0, steps),
        )
        for bound in buckets_for(sli, spec)
    ]
    series.append(Series(f"{metric}_bucket{_labels(**base, le='+Inf')}", all_events))
    series.append(Series(f"{metric}_count{_labels(**base)}", all_events))
    return series


def _requests(tier: str, outcome: str, values: str) -> Series:
    labels = _labels(tier=tier, model=_MODEL, route=_ROUTE, outcome=outcome)
    return Series(f"{REQUESTS}{labels}", values)


def _availability_series(tier: str, case: str, steps: int, rate: int, low: int) -> list[Series]:
    if case == "breach":
        return [_requests(tier, "server_error", _ramp(rate, steps))]
    if case == "low":
        return [_requests(tier, "server_error", _ramp_then_flat(low, steps))]
    ignored = [
        _requests(tier, outcome, _ramp(rate, steps))
        for outcome in OUTCOMES_EXCLUDED_FROM_AVAILABILITY
    ]
    return [_requests(tier, GOOD_OUTCOME, _ramp(rate, steps)), *ignored]


def _goodput_series(tier: str, case: str, steps: int, rate: int, low: int) -> list[Series]:
    """Every request ok: good ones in the good-requests counter too (healthy, with client
    errors and cancellations on top, which goodput leaves out), bad ones not (breach, low):
    a rule that read the outcome instead of the counter fires on healthy traffic or stays
    silent on the breach."""
    good = f"{GOOD_REQUESTS}{_labels(tier=tier, model=_MODEL, route=_ROUTE)}"
    if case == "healthy":
        ok = _ramp(rate, steps)
        ignored = [_requests(tier, o, ok) for o in OUTCOMES_EXCLUDED_FROM_AVAILABILITY]
        return [_requests(tier, GOOD_OUTCOME, ok), Series(good, ok), *ignored]
    ok = _ramp(rate, steps) if case == "breach" else _ramp_then_flat(low, steps)
    return [_requests(tier, GOOD_OUTCOME, ok), Series(good, _ramp(0, steps))]


def test_groups(spec: SLOSpec, links: Links) -> list[dict[str, Any]]:
    """The `tests:` of the promtool file, as data."""
    rules = alert_rules(spec)
    interval = evaluation_interval_s(spec)
    grid = rule_evaluation_s(spec)
    checks = check_grid_s(spec)
    min_events = spec.alert_policy.min_events
    longest_for = max((rule.for_s for rule in rules if rule.tier is not None), default=0.0)
    # One shortest window to fill, then past the longest `for`: on the grid, plus one evaluation
    # (the first evaluation that sees the breach starts the `for`).
    eval_s = _on_grid(min(windows_s(spec)) + 2 * interval, grid) + _on_grid(longest_for, grid)
    eval_s = _on_grid(eval_s, checks)
    steps = math.ceil(eval_s / interval) + 1
    rate = max(10, min_events)  # events per interval: every window holds >= min_events
    # All bad yet never min_events in any window, even extrapolated by up to 5/4.
    low = math.ceil(min_events / _MAX_EXTRAPOLATION) - 1
    groups: list[dict[str, Any]] = []
    by_tier_sli: dict[tuple[str, str], list[AlertRule]] = {}
    for rule in rules:
        if rule.tier is not None and rule.sli is not None:
            by_tier_sli.setdefault((rule.tier, rule.sli), []).append(rule)
    for (tier, sli), tier_rules in by_tier_sli.items():
        names = list(dict.fromkeys(rule.name for rule in tier_rules))
        cases = ["breach", "healthy"] + (["low"] if min_events > 1 else [])
        for case in cases:
            if sli == AVAILABILITY:
                series = _availability_series(tier, case, steps, rate, low)
            elif sli == GOODPUT:
                series = _goodput_series(tier, case, steps, rate, low)
            else:
                series = _latency_series(spec, tier, sli, case, steps, rate, low)
            alert_tests = [
                {
                    "eval_time": prom_duration(eval_s),
                    "alertname": name,
                    "exp_alerts": expected_alerts(
                        [r for r in tier_rules if r.name == name] if case == "breach" else [],
                        spec,
                        links,
                    ),
                }
                for name in names
            ]
            groups.append(
                {
                    "name": f"{tier} {sli} {case}",
                    "interval": prom_duration(interval),
                    "input_series": [{"series": s.series, "values": s.values} for s in series],
                    "alert_rule_test": alert_tests,
                }
            )
    groups.extend(_absent_groups(spec, rules, links, interval, grid))
    groups.extend(burn_groups(spec, rules, links, burn_timing(spec)))
    groups.extend(phase_groups(spec, rules, links, interval, grid))
    return groups


def _absent_groups(
    spec: SLOSpec, rules: list[AlertRule], links: Links, interval: float, grid: float
) -> list[dict[str, Any]]:
    absent = [rule for rule in rules if rule.kind == "absent"]
    groups: list[dict[str, Any]] = []
    for rule in absent:
        eval_s = _on_grid(rule.for_s + 2 * interval, grid) + grid
        steps = math.ceil(eval_s / interval) + 1
        present = _labels(
            tier=spec.default_tier.name, model=_MODEL, route=_ROUTE, outcome=GOOD_OUTCOME
        )
        for case, series, expected in (
            ("absent", [], [rule]),
            ("present", [{"series": f"{REQUESTS}{present}", "values": _ramp(1, steps)}], []),
        ):
            groups.append(
                {
                    "name": f"metrics {case}",
                    "interval": prom_duration(interval),
                    "input_series": series,
                    "alert_rule_test": [
                        {
                            "eval_time": prom_duration(eval_s),
                            "alertname": rule.name,
                            "exp_alerts": expected_alerts(expected, spec, links),
                        }
                    ],
                }
            )
    return groups


def render_rules_test(spec: SLOSpec, links: Links, rules_file: str = "rules.yml") -> str:
    return render(
        "rules_test.yml.j2",
        rules_file=rules_file,
        evaluation_interval=prom_duration(rule_evaluation_s(spec)),
        group_eval_order=group_order(spec),
        groups=test_groups(spec, links),
        source=spec.source,
    )
