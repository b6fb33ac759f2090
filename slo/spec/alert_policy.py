"""The alert policy of a spec: burn-rate rules, threshold alerts and the low-traffic guard."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slo.spec.anomaly_policy import AnomalyPolicy, build_anomaly_policy
from slo.spec.fields import Fail, count, duration, line_of, optional_section, positive
from slo.units import format_duration

_POLICY_KEYS = ("min_events", "min_request_rate", "burn_rates", "thresholds", "anomalies")


@dataclass(frozen=True, slots=True)
class BurnRateRule:
    """Alert when the budget burns `factor` times too fast over both windows (SRE workbook)."""

    severity: str
    long_window_s: float
    short_window_s: float
    factor: float
    # Pyrra's dynamic burn rate: fire at the bad-event count the factor means at the SLO
    # window's average traffic, whatever the traffic now (quiet nights page no sooner).
    dynamic: bool = False


@dataclass(frozen=True, slots=True)
class ThresholdAlert:
    """Alert when the p-th percentile exceeds `factor` x the objective's threshold for `for_s`."""

    percentile: float
    factor: float
    for_s: float = 0.0


DEFAULT_BURN_RATES: tuple[BurnRateRule, ...] = (
    BurnRateRule("page", 3600.0, 300.0, 14.4),
    BurnRateRule("page", 6 * 3600.0, 1800.0, 6.0),
    BurnRateRule("ticket", 86400.0, 2 * 3600.0, 3.0),
    BurnRateRule("ticket", 3 * 86400.0, 6 * 3600.0, 1.0),
)
# Operations practice: p95 above 2x target, p99 above 3x target, or p50 above target for 15m.
DEFAULT_THRESHOLD_ALERTS: tuple[ThresholdAlert, ...] = (
    ThresholdAlert(95.0, 2.0),
    ThresholdAlert(99.0, 3.0),
    ThresholdAlert(50.0, 1.0, 900.0),
)


@dataclass(frozen=True, slots=True)
class AlertPolicy:
    burn_rates: tuple[BurnRateRule, ...] = DEFAULT_BURN_RATES
    thresholds: tuple[ThresholdAlert, ...] = DEFAULT_THRESHOLD_ALERTS
    # Low-traffic guard: below this many events in a window no alert fires.
    min_events: int = 10
    anomalies: AnomalyPolicy = field(default_factory=AnomalyPolicy)
    # Second low-traffic guard: burn-rate alerts need at least this many events per second
    # in every window they read (0: off).
    min_request_rate: float = 0.0

    @property
    def windows_s(self) -> tuple[float, ...]:
        """Every distinct window the burn-rate rules look at, shortest first."""
        windows = {w for rule in self.burn_rates for w in (rule.long_window_s, rule.short_window_s)}
        return tuple(sorted(windows))

    def to_dict(self) -> dict[str, Any]:
        return {
            "min_events": self.min_events,
            "burn_rates": [
                {
                    "severity": rule.severity,
                    "long": format_duration(rule.long_window_s),
                    "short": format_duration(rule.short_window_s),
                    "factor": rule.factor,
                }
                | ({"dynamic": True} if rule.dynamic else {})
                for rule in self.burn_rates
            ],
            "thresholds": [
                {"percentile": alert.percentile, "factor": alert.factor}
                | ({"for": format_duration(alert.for_s)} if alert.for_s else {})
                for alert in self.thresholds
            ],
            "anomalies": self.anomalies.to_dict(),
        } | ({"min_request_rate": self.min_request_rate} if self.min_request_rate else {})


def build_alert_policy(raw: object, line: int, fail: Fail) -> AlertPolicy:
    raw = optional_section(
        raw, line, "alert_policy", _POLICY_KEYS, "burn_rates, thresholds, min_events", fail
    )
    if raw is None:
        return AlertPolicy()
    burn_rates = DEFAULT_BURN_RATES
    if "burn_rates" in raw:
        rules = raw["burn_rates"]
        if not isinstance(rules, list):
            fail(
                line_of(raw, "burn_rates"),
                "'burn_rates' must be a list of {severity, long, short, factor}",
            )
        burn_rates = tuple(
            _burn_rate(rule, line_of(rules, i), fail) for i, rule in enumerate(rules)
        )
    thresholds = DEFAULT_THRESHOLD_ALERTS
    if "thresholds" in raw:
        items = raw["thresholds"]
        if not isinstance(items, list):
            fail(line_of(raw, "thresholds"), "'thresholds' must be a list of {percentile, factor}")
        thresholds = tuple(
            _threshold(item, line_of(items, i), fail) for i, item in enumerate(items)
        )
    anomalies = build_anomaly_policy(raw.get("anomalies"), line_of(raw, "anomalies"), fail)
    min_rate = positive(raw, "min_request_rate", fail) if "min_request_rate" in raw else 0.0
    min_events = count(raw, "min_events", 10, fail, minimum=0)
    return AlertPolicy(burn_rates, thresholds, min_events, anomalies, min_rate)


def _burn_rate(raw: object, line: int, fail: Fail) -> BurnRateRule:
    if not isinstance(raw, Mapping) or not {"long", "short", "factor"} <= set(raw):
        fail(
            line,
            "a burn-rate rule needs long, short and factor, e.g. "
            "{severity: page, long: 1h, short: 5m, factor: 14.4}",
        )
    assert isinstance(raw, Mapping)
    long_s = duration(raw, "long", 0.0, fail)
    short_s = duration(raw, "short", 0.0, fail)
    if short_s >= long_s:
        fail(line_of(raw, "short"), "the short window must be shorter than the long one")
    factor = positive(raw, "factor", fail)
    dynamic = raw.get("dynamic", False)
    if not isinstance(dynamic, bool):
        fail(line_of(raw, "dynamic"), f"dynamic must be true or false, got {dynamic!r}")
    return BurnRateRule(str(raw.get("severity", "page")), long_s, short_s, factor, bool(dynamic))


def _threshold(raw: object, line: int, fail: Fail) -> ThresholdAlert:
    if not isinstance(raw, Mapping) or not {"percentile", "factor"} <= set(raw):
        fail(
            line, "a threshold alert needs percentile and factor, e.g. {percentile: 95, factor: 2}"
        )
    assert isinstance(raw, Mapping)
    percentile = positive(raw, "percentile", fail)
    if percentile >= 100:
        fail(line_of(raw, "percentile"), "percentile must be below 100")
    for_s = duration(raw, "for", 0.0, fail) if "for" in raw else 0.0
    return ThresholdAlert(percentile, positive(raw, "factor", fail), for_s)
