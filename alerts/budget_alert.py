"""The error-budget-exhausted ticket: an objective has spent its whole error budget over the
SLO window (Sloth's plugin of the same name). Burn-rate alerts say the budget is going; this
one says it is gone, and stays until the window forgets enough bad events.

The definition is `slo.alert_budget`'s (name, labels, `for`, the comparison the live judge
makes exactly); this module spells it in PromQL. Latency and goodput objectives carry the phase
to blame, like their burn-rate alerts.
"""

from __future__ import annotations

from alerts.phases import join_phase, phase_annotation
from alerts.rule_types import Links, Rule
from slo.alert_budget import ALERT_NAME, FOR_S, budget_labels
from slo.alert_rules import budget_objectives, error_budget, phases_of
from slo.arithmetic import MIN_EVENTS_OPERATOR
from slo.promql import number, prom_duration, record_error_ratio, record_events, selector
from slo.spec import SLOSpec, Tier
from slo.spec.objectives import Objective
from slo.units import format_duration

__all__ = ["ALERT_NAME", "budget_alerts", "budget_labels"]


def budget_expr(spec: SLOSpec, tier: Tier, objective: Objective) -> str:
    labels = {"tier": tier.name, "objective": objective.name}
    ratio = selector(record_error_ratio(spec.window_s), **labels)
    events = selector(record_events(spec.window_s), **labels)
    budget = number(error_budget(objective))
    guard = f"{MIN_EVENTS_OPERATOR} {spec.alert_policy.min_events}"
    condition = f"{ratio} >= {budget}\nand {events} {guard}"
    if phases_of(objective.indicator):
        return join_phase(tier.name, _blaming(objective), condition)
    return condition


def _blaming(objective: Objective) -> str:
    sli = objective.sli or "e2e"
    return sli if sli in ("ttft", "tpot", "itl", "e2e") else "e2e"


def budget_annotations(
    spec: SLOSpec, tier: Tier, objective: Objective, links: Links
) -> dict[str, str]:
    window = format_duration(spec.window_s)
    annotations = {
        "summary": f"Tier {tier.name} has spent the whole error budget of '{objective.name}'",
        "description": f"Over the last {window}, at least "
        f"{number(error_budget(objective) * 100)}% of tier {tier.name}'s events missed "
        f"'{objective.name}': the budget of the SLO window is gone. It clears as the window "
        f"forgets bad events; until then, favour reliability over releases.",
        "runbook_url": f"{links.runbook_base.rstrip('/')}/{ALERT_NAME}.md",
        "dashboard_url": f"{links.dashboard}?var-tier={tier.name}",
    }
    if phases_of(objective.indicator):
        annotations["phase"] = phase_annotation()
    return annotations


def budget_alerts(spec: SLOSpec, tier: Tier, links: Links) -> list[Rule]:
    return [
        Rule(
            budget_expr(spec, tier, objective),
            alert=ALERT_NAME,
            for_=prom_duration(FOR_S),
            labels=budget_labels(tier, objective),
            annotations=budget_annotations(spec, tier, objective, links),
        )
        for objective in budget_objectives(tier)
    ]
