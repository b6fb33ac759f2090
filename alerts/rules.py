"""Prometheus recording and alerting rules for a spec, from `slo.alert_rules`.

Recording rules (`alerts.records`), per tier and objective, for every window of the policy
and the SLO window: the error ratio (bad events over events, event-weighted across models,
routes and replicas) and the event count the low-traffic guard reads, plus two constants
(error budget, latency threshold) that dashboards divide by; windows longer than 5m add
recorded tiles (5-minute ones up to 6h, hourly ones past it). Alerts read those records;
threshold alerts take `histogram_quantile` over the bucket rates of a 5m window, recorded once
per tier and SLI (`alerts.quantiles`). Each tier has a fast group and a slow one
(`rule_groups`).
"""

from __future__ import annotations

from typing import Any

from alerts.anomalies import anomaly_alerts, anomaly_records, signal_quantiles
from alerts.budget_alert import budget_alerts
from alerts.culprits import culprit_annotation, culprit_records, culprit_text
from alerts.phases import phase_annotation, phase_records, phase_text, with_phase
from alerts.quantiles import bucket_rate_records, quantile_expr, threshold_quantiles
from alerts.records import (
    TILE_S,
    error_ratio_expr,
    events_expr,
    objective_records,
    recorded_windows,
    tile_of,
)
from alerts.rule_types import GOOD_OUTCOME, REQUESTS, Group, Links, Rule
from alerts.templating import render
from slo.alert_rules import (
    GOODPUT,
    UNATTRIBUTED,
    AlertRule,
    alert_rules,
    threshold_window_s,
    windows_s,
)
from slo.arithmetic import BURN_RATE_OPERATOR, MIN_EVENTS_OPERATOR
from slo.promql import (
    number,
    prom_duration,
    record_error_ratio,
    record_events,
    selector,
)
from slo.spec import SLOSpec
from slo.units import format_duration

__all__ = [
    "GOOD_OUTCOME",
    "REQUESTS",
    "Group",
    "Links",
    "Rule",
    "alert_annotations",
    "alert_expr",
    "error_ratio_expr",
    "events_expr",
    "group_order",
    "is_slow",
    "render_rules",
    "rule_groups",
    "shown_annotations",
]


def _series(record: str, rule: AlertRule) -> str:
    objective = rule.objective.name if rule.objective else ""
    return selector(record, tier=rule.tier or "", objective=objective)


def alert_expr(rule: AlertRule) -> str:
    """The PromQL of one alert: a series exactly when its condition holds, labelled with the
    phase to blame where it blames one (`alerts.phases.with_phase`)."""
    return with_phase(rule, condition_expr(rule))


def condition_expr(rule: AlertRule) -> str:
    """The alert's condition alone."""
    if rule.kind == "absent":
        return f"absent({REQUESTS})"
    if rule.kind == "burn_rate":
        return _burn_expr(rule)
    quantile = quantile_expr(
        (rule.percentile or 0) / 100, rule.tier or "", rule.sli or "", rule.window_s or 0.0
    )
    # The guard reads the objective's event count over the window, recorded earlier in the
    # group: the `sum(increase(<sli>_count[5m]))` it would compute, summed once per tier.
    events = _series(record_events(rule.window_s or 0.0), rule)
    return (
        f"{quantile} > {number(rule.threshold_s or 0)}\n"
        f"and on () sum({events}) {MIN_EVENTS_OPERATOR} {rule.min_events}"
    )


def _burn_expr(rule: AlertRule) -> str:
    """Both windows burning, each holding enough events (`AlertRule.fires`, in PromQL)."""
    long_w, short_w = rule.long_window_s or 0.0, rule.short_window_s or 0.0
    burns, guard = BURN_RATE_OPERATOR, MIN_EVENTS_OPERATOR  # slo.arithmetic's comparisons
    lines = ["("]
    for index, window_s in enumerate((long_w, short_w)):
        ratio = _series(record_error_ratio(window_s), rule)
        if rule.dynamic:
            # bad/events > limit x (w/W) x events(W) / events: the bad count average traffic
            # over the SLO window would allow in this window (Pyrra's dynamic burn rate).
            limit = number(rule.max_error_ratio or 0)
            share = f"{number(window_s)} / {number(rule.slo_window_s or 1)}"
            slo_events = _series(record_events(rule.slo_window_s or 0.0), rule)
            events = _series(record_events(window_s), rule)
            lines.append(f"  {ratio} {burns} {limit} * {share} * {slo_events} / {events}")
        else:
            lines.append(f"  {ratio} {burns} {number(rule.max_error_ratio or 0)}")
        lines.append("  and" if index == 0 else ")")
    for window_s in (long_w, short_w):
        needed = number(rule.guard_events(window_s))
        lines.append(f"and {_series(record_events(window_s), rule)} {guard} {needed}")
    return "\n".join(lines)


def alert_annotations(rule: AlertRule, spec: SLOSpec, links: Links) -> dict[str, str]:
    """summary, description, runbook_url, dashboard_url, and for a latency alert `phase`: a
    template reading the blamed phase's share of e2e now and before (`alerts.phases`), and
    `culprit`: the tier that caused most of the wait (`alerts.culprits`)."""
    annotations = _static_annotations(rule, spec, links)
    if rule.phases:
        annotations["phase"] = phase_annotation()
        annotations["culprit"] = culprit_annotation()
    return annotations


def shown_annotations(
    rule: AlertRule,
    spec: SLOSpec,
    links: Links,
    phase: str = UNATTRIBUTED,
    shares: tuple[float, float] | None = None,
    culprit: tuple[str, str, float] | None = None,
) -> dict[str, str]:
    """The annotations as Alertmanager shows them, for `phase` whose share of the mean e2e
    was shares[0] now and shares[1] before, and the (tier, cause, share) that caused most of
    the wait (promtool tests expect these)."""
    annotations = _static_annotations(rule, spec, links)
    if rule.phases:
        annotations["phase"] = phase_text(phase, shares)
        annotations["culprit"] = culprit_text(culprit)
    return annotations


def _static_annotations(rule: AlertRule, spec: SLOSpec, links: Links) -> dict[str, str]:
    """summary, description, runbook_url, dashboard_url: static text, so promtool can check it."""
    runbook = f"{links.runbook_base.rstrip('/')}/{rule.name}.md"
    dashboard = links.dashboard + (f"?var-tier={rule.tier}" if rule.tier else "")
    if rule.kind == "absent":
        return {
            "summary": "No LLM request metrics are being scraped",
            "description": f"No series of {REQUESTS} for {format_duration(rule.for_s)}: the "
            "LatencyMiddleware is not mounted, the replicas are down, or Prometheus does not "
            "scrape them. Every SLO alert is blind until this is fixed.",
            "runbook_url": runbook,
            "dashboard_url": dashboard,
        }
    assert rule.objective is not None and rule.tier is not None
    objective = rule.objective.name
    events = "gaps between tokens" if rule.sli == "itl" else "requests"
    guard = f"Fewer than {rule.min_events} {events} in a window never alert."
    if rule.kind == "burn_rate":
        long_w = prom_duration(rule.long_window_s or 0.0)
        short_w = prom_duration(rule.short_window_s or 0.0)
        lasts = format_duration(spec.window_s / float(rule.factor or 1))
        missed = "failed or missed a latency objective of the tier, against"
        missed = missed if rule.sli == GOODPUT else "missed"
        return {
            "summary": f"Tier {rule.tier} burns the error budget of '{objective}' "
            f"{number(rule.factor or 0)}x too fast",
            "description": f"Over both the last {long_w} and {short_w}, more than "
            f"{number((rule.max_error_ratio or 0) * 100)}% of tier {rule.tier}'s {events} "
            f"{missed} '{objective}' (error budget {number((rule.error_budget or 0) * 100)}% of "
            f"{format_duration(spec.window_s)}); at this rate the budget lasts about {lasts}. "
            f"{guard}",
            "runbook_url": runbook,
            "dashboard_url": dashboard,
        }
    return {
        "summary": f"Tier {rule.tier}: p{number(rule.percentile or 0)} {rule.sli} above "
        f"{number(rule.threshold_s or 0)}s ({number(rule.factor or 0)}x the '{objective}' "
        "threshold)",
        "description": f"The {number(rule.percentile or 0)}th percentile of {rule.sli} over the "
        f"last {prom_duration(rule.window_s or 0.0)} has been above "
        f"{number(rule.threshold_s or 0)}s"
        + (f" for {format_duration(rule.for_s)}" if rule.for_s else "")
        + f". {guard}",
        "runbook_url": runbook,
        "dashboard_url": dashboard,
    }


def is_slow(rule: AlertRule) -> bool:
    """Whether an alert belongs to its tier's slow group: a percentile threshold (a warning
    or info, never a page) or a burn rate whose long window is a sum of hourly tiles (it
    moves once an hour; its short window is 2h or more)."""
    if rule.kind == "threshold":
        return True
    return rule.kind == "burn_rate" and tile_of(rule.long_window_s or 0.0) == TILE_S


def _fast_windows(spec: SLOSpec, fast: list[AlertRule]) -> set[float]:
    """The windows the fast group's alerts read (the threshold window: dashboards' 5m)."""
    windows = {threshold_window_s(spec)}
    for rule in fast:
        windows.update(rule.counted_windows_s if rule.kind == "burn_rate" else ())
    return windows


def _alert(rule: AlertRule, spec: SLOSpec, links: Links) -> Rule:
    return Rule(
        alert_expr(rule),
        alert=rule.name,
        for_=prom_duration(rule.for_s) if rule.for_s else None,
        labels=rule.labels,
        annotations=alert_annotations(rule, spec, links),
    )


def rule_groups(
    spec: SLOSpec, links: Links, slow_interval: str | None = "1m", derive: bool = True
) -> list[Group]:
    """Two groups per tier, each its records first, then the alerts that read them (a group
    evaluates in order, so they read this evaluation's values).

    - `llm-slo-<tier>`, every evaluation interval: what pages read (the windows of the fast
      burn rates and the tiles they add up, phase means and the phase to blame), and the
      pages;
    - `llm-slo-<tier>-slow`, every `slow_interval`: what changes slowly or only tickets and
      dashboards read (constants, the ticket-only windows, sums of hourly tiles, the SLO
      window, bucket rates, the anomaly signals and bands) and the alerts on them (tickets
      whose long window is a sum of tiles, percentile thresholds, anomalies, the exhausted
      budget). It reads the fast group's records, never
      the reverse: at 1m, what it reads is at most one fast evaluation old.

    `group_order` lists them as promtool must evaluate them (fast before slow)."""
    rules = alert_rules(spec)
    every_window = set(windows_s(spec))
    needed = recorded_windows(every_window, derive)
    tiles = {tile for tile in map(tile_of, needed) if tile is not None} if derive else set()
    groups: list[Group] = []
    for tier in spec.tiers:
        own = [rule for rule in rules if rule.tier == tier.name]
        fast = [rule for rule in own if not is_slow(rule)]
        fast_windows = recorded_windows(_fast_windows(spec, fast), derive)
        slow_windows = needed - fast_windows
        records = objective_records(
            tier, fast_windows, every_window, constants=False, tiles=tiles, derive=derive
        )
        records += phase_records(tier) + culprit_records(tier)
        groups.append(
            Group(f"llm-slo-{tier.name}", records + [_alert(r, spec, links) for r in fast])
        )
        slow = objective_records(tier, slow_windows, every_window, tiles=tiles, derive=derive)
        quantiles = threshold_quantiles(rules, tier.name) | signal_quantiles(spec, tier)
        slow += bucket_rate_records(tier.name, quantiles)
        slow += anomaly_records(spec, tier)
        slow += [_alert(rule, spec, links) for rule in own if is_slow(rule)]
        slow += anomaly_alerts(spec, tier, links)
        slow += budget_alerts(spec, tier, links)
        if slow:
            groups.append(Group(f"llm-slo-{tier.name}-slow", slow, slow_interval))
    absent = [_alert(rule, spec, links) for rule in rules if rule.tier is None]
    groups.append(Group("llm-slo-meta", absent))
    return groups


def group_order(spec: SLOSpec) -> list[str]:
    """The groups in the order promtool must evaluate them at each step (its
    `group_eval_order`: without it, promtool takes the groups in random order, and a slow
    group could read the fast group's records of the step before)."""
    return [group.name for group in rule_groups(spec, Links())]


def render_rules(
    spec: SLOSpec, links: Links, slow_interval: str | None = "1m", derive: bool = True
) -> str:
    """The rule file; `derive=False` is the peer that reads raw series over long windows."""
    groups: list[dict[str, Any]] = [
        {"name": g.name, "interval": g.interval, "rules": g.rules}
        for g in rule_groups(spec, links, slow_interval, derive)
    ]
    return render("rules.yml.j2", groups=groups, source=spec.source)
