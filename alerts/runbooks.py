"""One Markdown runbook per alert name: what it means, a section per phase it may blame (what
to check, what usually fixes it: `alerts.phase_guide`), PromQL, steps."""

from __future__ import annotations

from dataclasses import dataclass

from alerts.anomalies import ALERT_NAME, watched
from alerts.budget_alert import ALERT_NAME as BUDGET_ALERT
from alerts.phase_guide import guides
from alerts.rule_types import GOOD_REQUESTS
from alerts.rules import GOOD_OUTCOME, REQUESTS
from alerts.templating import render
from slo.alert_rules import AVAILABILITY, GOODPUT, AlertRule, alert_rules
from slo.arithmetic import goodput_checks
from slo.promql import (
    ANOMALY_LOWER_RECORD,
    ANOMALY_SIGNAL_RECORD,
    ANOMALY_UPPER_RECORD,
    ANOMALY_WINDOW_RECORD,
    PHASE_GROWTH_RECORD,
    any_of,
    matcher,
    number,
    prom_duration,
    selector,
)
from slo.sli import CATALOG, OUTCOMES_EXCLUDED_FROM_AVAILABILITY, PHASES
from slo.spec import SLOSpec


@dataclass(frozen=True)
class Query:
    title: str
    expr: str


def _mean(sli: str) -> str:
    metric = CATALOG[sli].metric
    return f"sum by (tier) (rate({metric}_sum[5m])) / sum by (tier) (rate({metric}_count[5m]))"


def _quantile(sli: str, quantile: str) -> str:
    bucket = CATALOG[sli].metric + "_bucket"
    return f"histogram_quantile({quantile}, sum by (tier, le) (rate({bucket}[5m])))"


def queries(rules: list[AlertRule], slis: tuple[str, ...] = ()) -> list[Query]:
    """The PromQL an on-call engineer pastes first, for the tier of the alert; `slis`: the
    latency SLIs a goodput alert's tiers hold objectives on."""
    rule = rules[0]
    if rule.kind == "absent":
        return [
            Query("Are the replicas scraped at all?", "up"),
            Query("Any request metric, any label", f"count({REQUESTS})"),
        ]
    phases = rule.phases or PHASES
    found = [Query(f"Mean {phase} time per tier", _mean(phase)) for phase in phases]
    found.insert(
        0,
        Query(
            "Which phase grew: mean over the last 5m minus the baseline hour's, in seconds",
            f"sort_desc({PHASE_GROWTH_RECORD})",
        ),
    )
    if rule.sli in (AVAILABILITY, GOODPUT):
        bad = any_of((GOOD_OUTCOME, *OUTCOMES_EXCLUDED_FROM_AVAILABILITY))
        failed = selector(REQUESTS, matcher("outcome", "!~", bad))
        query = f"sum by (tier, outcome) (rate({failed}[5m]))"
        found.insert(0, Query("Failed requests per tier and outcome", query))
    if rule.sli == GOODPUT:
        # A request that is not good failed, or missed one of the tier's latency objectives.
        found[1:1] = [Query(f"p95 {sli} per tier", _quantile(sli, "0.95")) for sli in slis]
        counted = selector(
            REQUESTS, matcher("outcome", "!~", any_of(OUTCOMES_EXCLUDED_FROM_AVAILABILITY))
        )
        goodput = (
            f"sum by (tier) (rate({GOOD_REQUESTS}[5m]))\n/\nsum by (tier) (rate({counted}[5m]))"
        )
        found.insert(0, Query("Goodput per tier: good requests / counted requests", goodput))
    elif rule.sli != AVAILABILITY:
        sli = rule.sli or ""
        found.insert(0, Query(f"p95 {sli} per tier", _quantile(sli, "0.95")))
    queue = CATALOG["queue_depth"].metric
    found.append(
        Query("Requests waiting per replica and tier", f"sum by (instance, tier) ({queue})")
    )
    found.append(
        Query("KV-cache usage per replica", f"max by (instance) ({CATALOG['kv_usage'].metric})")
    )
    found.append(
        Query("Batch size per replica", f"avg by (instance) ({CATALOG['batch_size'].metric})")
    )
    return found


def goodput_slis(spec: SLOSpec, rules: list[AlertRule]) -> dict[str, list[str]]:
    """For goodput alerts: each per-request latency SLI a good request of their tiers must
    meet (`slo.arithmetic.goodput_checks`), with the objectives on it; {} for other alerts."""
    found: dict[str, list[str]] = {}
    for tier in dict.fromkeys(r.tier for r in rules if r.sli == GOODPUT and r.tier):
        objectives = spec.tier(tier).latency_objectives
        checked = {check.field for check in goodput_checks(objectives)}
        for objective in objectives:
            sli = objective.sli or ""
            if CATALOG[sli].record_field in checked:
                found.setdefault(sli, []).append(f"{tier}: {objective.name}")
    return found


def render_runbooks(spec: SLOSpec) -> dict[str, str]:
    """{alertname: Markdown}, one per distinct alert name."""
    by_name: dict[str, list[AlertRule]] = {}
    for rule in alert_rules(spec):
        by_name.setdefault(rule.name, []).append(rule)
    pages: dict[str, str] = {}
    for name, rules in by_name.items():
        rule = rules[0]
        checked = goodput_slis(spec, rules)
        pages[name] = render(
            "runbook.md.j2",
            name=name,
            rule=rule,
            rules=rules,
            queries=queries(rules, tuple(checked)),
            goodput_slis=checked,
            phase_guides=guides(rule.phases or PHASES),
            catalog=CATALOG,
            number=number,
            prom_duration=prom_duration,
            availability=AVAILABILITY,
            goodput=GOODPUT,
            source=spec.source,
        )
    pages[BUDGET_ALERT] = render(
        "budget_runbook.md.j2",
        name=BUDGET_ALERT,
        source=spec.source,
        window=prom_duration(spec.window_s),
    )
    anomaly = anomaly_runbook(spec)
    if anomaly is not None:
        pages[ALERT_NAME] = anomaly
    return pages


def anomaly_runbook(spec: SLOSpec) -> str | None:
    """The runbook of the anomaly info alert, if any tier watches any signal."""
    watched_by: dict[str, list[str]] = {}
    for tier in spec.tiers:
        for signal in watched(spec, tier):
            watched_by.setdefault(signal, []).append(tier.name)
    if not watched_by:
        return None
    policy = spec.alert_policy.anomalies
    return render(
        "anomaly_runbook.md.j2",
        name=ALERT_NAME,
        source=spec.source,
        policy=policy,
        for_=prom_duration(policy.for_s),
        watched=watched_by,
        signal_record=ANOMALY_SIGNAL_RECORD,
        window_record=ANOMALY_WINDOW_RECORD,
        upper_record=ANOMALY_UPPER_RECORD,
        lower_record=ANOMALY_LOWER_RECORD,
    )
