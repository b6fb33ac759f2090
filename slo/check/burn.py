"""Burn rates per alert window, and which burn-rate alerts fire, for `slo check`: each rule
judges through `slo.alert_rules.AlertRule.fires`, as the generated Prometheus rules and the live
windows do (low-traffic and request-rate guards, dynamic thresholds)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slo import arithmetic
from slo.alert_rules import URGENCY, burn_rules
from slo.spec import SLOSpec
from slo.spec.objectives import Objective
from slo.units import format_duration


@dataclass(frozen=True, slots=True)
class WindowBurn:
    window_s: float
    events: int
    bad: int
    burn_rate: float | None  # bad fraction / error budget; 1.0 spends the budget exactly

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": format_duration(self.window_s),
            "events": self.events,
            "bad": self.bad,
            "burn_rate": self.burn_rate,
        }


def burn_rates(
    spec: SLOSpec,
    objective: Objective,
    counts: dict[float, tuple[int, int]],
    total: tuple[int, int] | None = None,
) -> tuple[tuple[WindowBurn, ...], tuple[str, ...]]:
    """Burn rate per alert window from (events, bad) counts, and the burn-rate rules firing.

    Each rule judges through `AlertRule.fires`, as the generated rules and the live windows do
    (low-traffic guards, dynamic thresholds); `total`: (events, bad) over the SLO window, which
    a dynamic rule needs."""
    target = objective.target
    burns = {
        window_s: WindowBurn(window_s, events, bad, arithmetic.burn_rate(bad, events, target))
        for window_s, (events, bad) in counts.items()
    }
    known = {**counts, **({spec.window_s: total} if total is not None else {})}
    alerts: list[str] = []
    for rule in burn_rules(spec, objective):
        if not all(window in known for window in rule.counted_windows_s):
            continue  # a dynamic rule without the SLO window's counts
        windows = [(known[w][1], known[w][0]) for w in rule.counted_windows_s]
        if rule.fires(windows):
            alerts.append(
                f"{URGENCY[rule.severity]} {format_duration(rule.long_window_s or 0)}/"
                f"{format_duration(rule.short_window_s or 0)} x{rule.factor:g}"
            )
    return tuple(burns[w] for w in sorted(burns)), tuple(alerts)
