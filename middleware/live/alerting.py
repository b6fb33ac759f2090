"""The spec's alert rules evaluated in-process, and the push of firing alerts to Alertmanager.

The rules are `slo.alert_rules.alert_rules(spec)`, the same list `slo generate` renders for
Prometheus, evaluated with the same semantics (see that module): events and bad events from
the same histogram buckets, the low-traffic guards (events, events per second) on every
window, burn rate strictly above factor x budget on both windows, or above the dynamic
threshold (`AlertRule.fires`, through `slo.arithmetic`, exact), threshold alerts through the
same `histogram_quantile` over the policy's shortest window, held for `for`; the
error-budget-exhausted ticket on the SLO window's counts (`slo.alert_budget.exhausted`, exact),
held for its `for`. The absent-metrics alert and the anomaly info alerts (bands built from a
day of recorded signals, `alerts.anomalies`) are Prometheus' alone: nothing here judges them.
"""

from __future__ import annotations

import datetime as dt
import os
import ssl
from typing import TYPE_CHECKING, Any

import httpx

from slo import alert_budget
from slo.alert_rules import AlertRule, budget_objectives, histogram_quantile

if TYPE_CHECKING:
    from middleware.live import TierWindows


def firing_rules(
    rules: list[AlertRule],
    tiers: dict[str, TierWindows],
    now_s: float,
    pending: dict[str, float],
) -> list[dict[str, Any]]:
    """Alerts firing now. `pending` remembers since when each held condition has been true."""
    firing: list[dict[str, Any]] = []
    for rule in rules:
        if rule.kind == "absent" or rule.tier is None or rule.objective is None:
            continue
        windows = tiers[rule.tier]
        key = rule.name + repr(sorted(rule.labels.items()))
        if rule.kind == "burn_rate":
            counts = []  # (bad, events) per window
            for window in rule.counted_windows_s:
                events, good = windows.events_and_good(
                    rule.objective, windows.totals(window, now_s)
                )
                counts.append((events - good, events))
            active = rule.fires(counts)
            worst = max((bad / events for bad, events in counts if events), default=0.0)
            limit = float(rule.max_error_ratio or 0)
            summary = (
                f"{rule.tier}: {rule.objective.name} burns its error budget too fast "
                f"({worst:.4g} bad over the windows, limit {limit:.4g})"
            )
        else:
            totals = windows.totals(rule.window_s or 0.0, now_s)
            events, _ = windows.events_and_good(rule.objective, totals)
            cumulative = windows.cumulative_buckets(rule.sli or "", totals)
            observed = (
                histogram_quantile(float(rule.percentile or 0) / 100, cumulative)
                if cumulative
                else float("nan")
            )
            active = (
                events >= rule.min_events and events > 0 and observed > float(rule.threshold_s or 0)
            )
            summary = (
                f"{rule.tier}: p{rule.percentile} {rule.sli} is {observed:.4g}s, "
                f"above {rule.threshold_s}s"
            )
        if not active:
            pending.pop(key, None)
            continue
        since = pending.setdefault(key, now_s)
        if now_s - since >= rule.for_s:
            labels = {"alertname": rule.name, **rule.labels}
            firing.append(
                {"alertname": rule.name, "labels": labels, "annotations": {"summary": summary}}
            )
    return firing


def budget_firing(
    tiers: dict[str, TierWindows],
    window_s: float,
    min_events: int,
    now_s: float,
    pending: dict[str, float],
) -> list[dict[str, Any]]:
    """Error-budget-exhausted alerts firing now, one per tier and objective Prometheus judges
    (the same objectives, comparison, guard and `for` as the generated rule)."""
    firing: list[dict[str, Any]] = []
    for windows in tiers.values():
        totals = windows.totals(window_s, now_s)
        for objective in budget_objectives(windows.tier):
            labels = {
                "alertname": alert_budget.ALERT_NAME,
                **alert_budget.budget_labels(windows.tier, objective),
            }
            key = repr(sorted(labels.items()))
            events, good = windows.events_and_good(objective, totals)
            if not alert_budget.exhausted(good, events, objective, min_events):
                pending.pop(key, None)
                continue
            if now_s - pending.setdefault(key, now_s) >= alert_budget.FOR_S:
                summary = (
                    f"{windows.tier.name}: {objective.name} has spent its whole error "
                    f"budget ({events - good:g} bad of {events:g})"
                )
                firing.append(
                    {
                        "alertname": alert_budget.ALERT_NAME,
                        "labels": labels,
                        "annotations": {"summary": summary},
                    }
                )
    return firing


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
    verify, headers = _alertmanager_access()
    response = httpx.post(
        url.rstrip("/") + "/api/v2/alerts",
        json=payload,
        timeout=5.0,
        headers=headers,
        verify=verify,
    )
    response.raise_for_status()


def _alertmanager_access() -> tuple[Any, dict[str, str]]:
    """(verify, headers) of the push: an HTTPS Alertmanager verified against
    $LLM_SLO_ALERTMANAGER_CA_FILE (else the system's CAs), and the first line of
    $LLM_SLO_ALERTMANAGER_TOKEN_FILE as a bearer token, read at every push (rotation)."""
    ca_file = os.environ.get("LLM_SLO_ALERTMANAGER_CA_FILE") or None
    token_file = os.environ.get("LLM_SLO_ALERTMANAGER_TOKEN_FILE") or None
    verify: Any = ssl.create_default_context(cafile=ca_file) if ca_file else True
    headers = {}
    if token_file:
        with open(token_file, encoding="utf-8") as lines:
            headers["authorization"] = "Bearer " + lines.readline().strip()
    return verify, headers
