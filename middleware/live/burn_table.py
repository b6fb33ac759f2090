"""The on-call page's burn table (`middleware.live.page`): per burn-rate rule of the alert
policy, each objective's burn over the rule's long and short window, and whether its alert
fires or burns, as every judge decides it (`slo.alert_rules`, `slo.arithmetic`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from slo.alert_rules import burn_rules
from slo.arithmetic import burn_rate, burning
from slo.promql import prom_duration
from slo.units import format_duration

if TYPE_CHECKING:
    from middleware.live import LiveSLO, TierWindows
    from slo.spec.objectives import Objective


def _fires_now(
    live: LiveSLO,
    windows: TierWindows,
    objective: Objective,
    totals: dict[float, np.ndarray],
    policy_rule: Any,
) -> bool:
    """Whether the policy rule's alert on this objective fires on the windows' counts now, as
    every judge decides it (`AlertRule.fires`: guards, dynamic thresholds)."""
    for rule in burn_rules(live.spec, objective):
        windows_match = (rule.long_window_s, rule.short_window_s) == (
            policy_rule.long_window_s,
            policy_rule.short_window_s,
        )
        if windows_match and all(window in totals for window in rule.counted_windows_s):
            counts = []
            for window in rule.counted_windows_s:
                events, good = windows.events_and_good(objective, totals[window])
                counts.append((events - good, events))
            return rule.fires(counts)
    return False


def burn_table(
    live: LiveSLO,
    windows: TierWindows,
    objective: Objective,
    totals: dict[float, np.ndarray],
    firing: list[dict[str, str]],
) -> list[dict[str, Any]]:
    """Per burn-rate rule of the policy: the burn rate over its long and short window, and
    whether it fires (an alert of this objective with these windows is firing) or burns (at
    least one window above the factor: what fires next if it spreads)."""
    policy = live.spec.alert_policy
    rows = []
    for rule in policy.burn_rates:
        counts = []  # (bad, events) per window, long then short
        for window in (rule.long_window_s, rule.short_window_s):
            events, good = windows.events_and_good(objective, totals[window])
            counts.append((events - good, events))
        long_window = prom_duration(rule.long_window_s)
        short_window = prom_duration(rule.short_window_s)
        fires = any(
            labels.get("long_window") == long_window and labels.get("short_window") == short_window
            for labels in firing
        )
        if fires or _fires_now(live, windows, objective, totals, rule):
            state = "firing"
        elif any(burning(bad, events, objective.target, rule.factor) for bad, events in counts):
            state = "burning"
        elif all(events == 0 for _, events in counts):
            state = "no_data"
        else:
            state = "ok"
        rows.append(
            {
                "severity": rule.severity,
                "factor": rule.factor,
                "state": state,
                "long": format_duration(rule.long_window_s),
                "short": format_duration(rule.short_window_s),
                "long_rate": burn_rate(*counts[0], objective.target),
                "short_rate": burn_rate(*counts[1], objective.target),
            }
        )
    return rows
