"""The spec's alert rules evaluated in-process, and the push of firing alerts to Alertmanager.

Same rules as the generated Prometheus rules:
- burn rate: for an objective with an error budget, fire when the bad fraction over both the
  long and the short window exceeds `factor` x budget, and the long window holds at least
  `min_events` events (the low-traffic guard);
- threshold: for a latency objective, fire when the p-th percentile (Prometheus'
  `histogram_quantile` over the same buckets) over the last 5 minutes exceeds `factor` x its
  threshold, with at least `min_events` events, continuously for `for`.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import httpx

from slo.spec import SLOSpec
from slo.units import format_duration

if TYPE_CHECKING:
    from middleware.live import TierWindows

THRESHOLD_WINDOW_S = 300.0
SEVERITY = {"page": "critical", "ticket": "warning"}


def evaluate_alerts(
    spec: SLOSpec,
    tiers: dict[str, TierWindows],
    now_s: float,
    pending: dict[tuple[str, ...], float],
) -> list[dict[str, Any]]:
    """Firing alerts now. `pending` remembers since when each threshold alert has held."""
    policy = spec.alert_policy
    firing: list[dict[str, Any]] = []
    for tier_name, windows in tiers.items():
        cache: dict[float, Any] = {}

        def totals(
            window: float, windows: TierWindows = windows, cache: dict[float, Any] = cache
        ) -> Any:
            if window not in cache:
                cache[window] = windows.totals(window, now_s)
            return cache[window]

        for objective in windows.tier.objectives:
            if not objective.has_error_budget:
                continue
            budget = 1.0 - objective.target
            for rule in policy.burn_rates:
                long_events, long_good = windows.events_and_good(
                    objective, totals(rule.long_window_s)
                )
                short_events, short_good = windows.events_and_good(
                    objective, totals(rule.short_window_s)
                )
                if long_events < policy.min_events or not short_events or budget <= 0:
                    continue
                long_burn = (long_events - long_good) / long_events / budget
                short_burn = (short_events - short_good) / short_events / budget
                if long_burn > rule.factor and short_burn > rule.factor:
                    firing.append(
                        _alert(
                            "LLMSLOErrorBudgetBurn",
                            tier_name,
                            SEVERITY.get(rule.severity, rule.severity),
                            objective.name,
                            f"{tier_name}: {objective.name} burns its error budget {long_burn:.1f}x too fast over {format_duration(rule.long_window_s)}",
                            {
                                "long_window": format_duration(rule.long_window_s),
                                "short_window": format_duration(rule.short_window_s),
                            },
                        )
                    )
            if objective.kind != "latency" or not objective.sli:
                continue
            recent = totals(THRESHOLD_WINDOW_S)
            events, _ = windows.events_and_good(objective, recent)
            for alert in policy.thresholds:
                observed = windows.quantile(objective.sli, alert.percentile / 100, recent)
                limit = alert.factor * (objective.threshold_s or 0.0)
                key = (tier_name, objective.name, str(alert.percentile), str(alert.factor))
                breached = events >= policy.min_events and observed is not None and observed > limit
                if not _held_for(pending, key, breached, alert.for_s, now_s):
                    continue
                firing.append(
                    _alert(
                        "LLMSLOLatencyThreshold",
                        tier_name,
                        "critical" if alert.factor >= 3 else "warning",
                        objective.name,
                        f"{tier_name}: p{alert.percentile:g} {objective.sli} is {observed:.3f}s, above {alert.factor:g}x the {objective.threshold_s:g}s objective",
                        {"percentile": f"{alert.percentile:g}", "factor": f"{alert.factor:g}"},
                    )
                )
    return firing


def _held_for(
    pending: dict[tuple[str, ...], float],
    key: tuple[str, ...],
    breached: bool,
    for_s: float,
    now_s: float,
) -> bool:
    if not breached:
        pending.pop(key, None)
        return False
    since = pending.setdefault(key, now_s)
    return now_s - since >= for_s


def _alert(
    name: str, tier: str, severity: str, objective: str, summary: str, extra: dict[str, str]
) -> dict[str, Any]:
    return {
        "alertname": name,
        "labels": {
            "alertname": name,
            "tier": tier,
            "severity": severity,
            "objective": objective,
            **extra,
        },
        "annotations": {"summary": summary},
    }


def push_to_alertmanager(url: str, alerts: list[dict[str, Any]], interval_s: float) -> None:
    """POST firing alerts to Alertmanager's v2 API; they end on their own unless re-sent."""
    now = dt.datetime.now(dt.UTC)
    ends = now + dt.timedelta(seconds=max(3 * interval_s, 60))
    payload = [
        {
            "labels": alert["labels"],
            "annotations": alert["annotations"],
            "startsAt": now.isoformat(),
            "endsAt": ends.isoformat(),
            "generatorURL": "llm-slo://middleware/slo",
        }
        for alert in alerts
    ]
    response = httpx.post(url.rstrip("/") + "/api/v2/alerts", json=payload, timeout=5.0)
    response.raise_for_status()
