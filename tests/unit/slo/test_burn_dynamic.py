"""Traffic-aware burn rates in the one SLO arithmetic: exact at the boundary, the same bad
count whatever the traffic, and both low-traffic guards; `AlertRule.fires` composes them."""

from __future__ import annotations

from decimal import Decimal

from slo.alert_rules import alert_rules
from slo.arithmetic import dynamic_burning, rate_guarded
from slo.spec import SLOSpec

SPEC = SLOSpec.from_yaml(
    """
version: 1
window: 1h
tiers:
  - name: premium
    default: true
    objectives: [availability >= 99%]
alert_policy:
  min_events: 1
  min_request_rate: 0.1
  thresholds: []
  anomalies: {enabled: false}
  burn_rates:
    - {severity: page, long: 10m, short: 2m, factor: 2, dynamic: true}
"""
)


def test_dynamic_threshold_is_an_absolute_count_exactly() -> None:
    # 2% x 60,600 x 600/3600 = 202 bad events allowed; strictly more fires.
    assert not dynamic_burning(202, 60_600, 600, 3600, Decimal("0.99"), 2)
    assert dynamic_burning(203, 60_600, 600, 3600, Decimal("0.99"), 2)
    assert not dynamic_burning(5, 0, 600, 3600, Decimal("0.99"), 2)  # no SLO-window events: never


def test_rate_guard_is_events_per_second_of_the_window() -> None:
    assert rate_guarded(30, 300, Decimal("0.1"))
    assert not rate_guarded(29, 300, Decimal("0.1"))
    assert rate_guarded(0, 300, 0)


def test_alert_rule_fires_reads_the_slo_window_last() -> None:
    (rule,) = alert_rules(SPEC)[:1]
    assert rule.dynamic and rule.counted_windows_s == (600.0, 120.0, 3600.0)
    assert rule.guard_events(600.0) == Decimal("60")  # 0.1/s x 600 s beats min_events 1
    at_1_per_s = [(203, 600), (103, 120), (0, 60_600)]
    at_100_per_s = [(203, 60_000), (103, 12_000), (0, 60_600)]
    assert rule.fires(at_1_per_s) and rule.fires(at_100_per_s)
    assert not rule.fires([(202, 600), (103, 120), (0, 60_600)])
    assert not rule.fires([(203, 59), (103, 120), (0, 60_600)])  # under 0.1/s over 10m
