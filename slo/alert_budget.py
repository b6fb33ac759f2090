"""The error-budget-exhausted ticket, one definition for every judge.

Per tier and objective Prometheus can judge (`slo.alert_rules.budget_objectives`): the SLO
window's error ratio at or above the error budget (`slo.arithmetic.budget_remaining` at or
below zero, exact), with at least `alert_policy.min_events` events, held for `FOR_S`.
`alerts.budget_alert` spells it in PromQL; the live judge (`middleware.live`) calls
`exhausted` on its SLO-window counts.
"""

from __future__ import annotations

from slo.alert_rules import URGENCY, URGENCY_LABEL, Severity
from slo.arithmetic import Count, budget_remaining, guarded
from slo.spec import Tier
from slo.spec.objectives import Objective

ALERT_NAME = "LLMSLOErrorBudgetExhausted"
SEVERITY: Severity = "warning"
FOR_S = 300.0


def budget_labels(tier: Tier, objective: Objective) -> dict[str, str]:
    """The alert's static labels (Prometheus adds `phase` on latency objectives)."""
    return {
        "severity": SEVERITY,
        URGENCY_LABEL: URGENCY[SEVERITY],
        "tier": tier.name,
        "sli": objective.indicator,
        "objective": objective.name,
    }


def exhausted(good: Count, events: Count, objective: Objective, min_events: int) -> bool:
    """Whether the SLO window's counts have spent the whole budget: `bad / events >= budget`
    with at least `min_events` events, as the generated rule compares them."""
    if not guarded(events, min_events):
        return False
    remaining = budget_remaining(good, events, objective.target)
    return remaining is not None and remaining <= 0
