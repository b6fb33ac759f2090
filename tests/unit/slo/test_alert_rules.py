"""slo.alert_rules: the alerts a spec implies, their exact numbers, and the shared helpers."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest

from slo.alert_rules import (
    alert_rules,
    error_budget,
    histogram_quantile,
    unbucketed_thresholds,
    unreachable,
    windows_s,
)
from slo.promql import exact, le_matcher, le_value, number, prom_duration
from slo.sli import PHASES
from slo.spec import SLOSpec

SHORT = """
version: 1
window: 1h
tiers:
  - name: gold
    default: true
    objectives: [p95 ttft <= 250ms, p50 e2e <= 1.5s, availability >= 99.95%]
alert_policy:
  min_events: 5
  burn_rates:
    - {severity: page, long: 2m, short: 30s, factor: 10}
    - {severity: ticket, long: 10m, short: 1m, factor: 2}
  thresholds:
    - {percentile: 90, factor: 1.5, for: 1m}
    - {percentile: 99, factor: 100}
"""


def test_example_spec_alerts_map_policy_severities_and_numbers_exactly() -> None:
    rules = alert_rules(SLOSpec.default())
    burn = [r for r in rules if r.kind == "burn_rate" and r.tier == "premium"]
    ttft = [r for r in burn if r.sli == "ttft"]
    assert [(r.severity, r.long_window_s, r.short_window_s) for r in ttft] == [
        ("critical", 3600.0, 300.0),
        ("critical", 21600.0, 1800.0),
        ("warning", 86400.0, 7200.0),
        ("warning", 259200.0, 21600.0),
    ]
    assert ttft[0].max_error_ratio == Decimal("0.72")
    availability = next(r for r in burn if r.sli == "availability")
    assert availability.error_budget == Decimal("0.001")  # 99.9% read as 0.9990000000000001
    assert number(availability.max_error_ratio or 0) == "0.0144"
    assert {r.min_events for r in rules if r.kind != "absent"} == {10}
    assert sum(r.kind == "absent" for r in rules) == 1


def test_threshold_alerts_carry_factor_times_threshold_and_severity() -> None:
    rules = alert_rules(SLOSpec.default())
    premium_ttft = [
        r for r in rules if r.kind == "threshold" and r.tier == "premium" and r.sli == "ttft"
    ]
    assert [(number(r.percentile or 0), number(r.threshold_s or 0), r.for_s, r.severity)
            for r in premium_ttft] == [
        ("95", "0.4", 0.0, "warning"),
        ("99", "0.6", 0.0, "warning"),
        ("50", "0.2", 900.0, "info"),
    ]  # fmt: skip
    assert all(r.window_s == 300.0 for r in premium_ttft)


def test_goodput_gets_burn_rate_alerts_and_throughput_none() -> None:
    spec = SLOSpec.default()
    rules = alert_rules(spec)
    goodput = [r for r in rules if r.objective is not None and r.objective.kind == "goodput"]
    # One per burn-rate rule of the policy, labelled sli="goodput", blaming any phase; no
    # percentile threshold (goodput has no histogram).
    assert [(r.kind, r.name, r.tier, r.sli) for r in goodput] == [
        ("burn_rate", "LLMSLOGoodputBudgetBurn", "premium", "goodput")
    ] * len(spec.alert_policy.burn_rates)
    assert [r.factor for r in goodput] == [exact(b.factor) for b in spec.alert_policy.burn_rates]
    assert all(r.phases == PHASES for r in goodput)
    assert not any(r.objective.kind == "throughput" for r in rules if r.objective is not None)
    spec = SLOSpec.from_yaml("tiers:\n- name: t\n  objectives: ['throughput >= 5 tokens/s']\n")
    assert [r.kind for r in alert_rules(spec)] == ["absent"]


def test_alerts_that_could_never_fire_are_left_out_and_explained() -> None:
    spec = SLOSpec.from_yaml(SHORT)
    rules = alert_rules(spec)
    # p50 e2e: budget 0.5, factor 10 -> an error ratio above 5 is impossible; factor 2 -> 1.
    e2e_burns = [r for r in rules if r.sli == "e2e" and r.kind == "burn_rate"]
    assert e2e_burns == []
    # p99 > 100 x 250ms = 25s lies above the highest TTFT bucket (10s): never observable.
    assert not any(r.kind == "threshold" and r.factor == 100 and r.sli == "ttft" for r in rules)
    notes = unreachable(spec)
    assert len(notes) == 4
    assert any("p99 > 25s can never be seen" in note for note in notes)
    assert any("needs an error ratio above 5" in note for note in notes)


def test_unusual_windows_are_recorded_and_threshold_window_is_the_shortest() -> None:
    spec = SLOSpec.from_yaml(SHORT)
    assert windows_s(spec) == (30.0, 60.0, 120.0, 600.0, 3600.0)
    assert {r.window_s for r in alert_rules(spec) if r.kind == "threshold"} == {30.0}
    gold = next(r for r in alert_rules(spec) if r.sli == "availability")
    assert gold.error_budget == Decimal("0.0005")
    assert gold.max_error_ratio == Decimal("0.005")


def test_error_budget_is_exact() -> None:
    spec = SLOSpec.from_yaml(SHORT)
    budgets = [error_budget(o) for o in spec.tiers[0].objectives]
    assert [number(b) for b in budgets] == ["0.05", "0.5", "0.0005"]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (14.4 * 0.05, "0.72"),
        (1 - 0.999, "0.001"),
        (0.1 + 0.2, "0.3"),
        (72.0, "72"),
        (2e-05, "0.00002"),
    ],
)
def test_number_prints_no_float_artifacts(value: float, text: str) -> None:
    assert number(value) == text


def test_prom_duration_and_le_spelling() -> None:
    assert [prom_duration(s) for s in (30, 300, 3600, 86400, 604800, 90, 0.5)] == [
        "30s", "5m", "1h", "1d", "1w", "90s", "500ms",
    ]  # fmt: skip
    assert le_value(0.25) == "0.25" and le_value(10.0) == "10.0"
    assert le_matcher(0.25) == 'le="0.25"'
    assert le_matcher(1.0) == 'le=~"1|1\\\\.0"'  # Prometheus 3 rewrites le="1.0" to le="1"
    assert exact(0.1 + 0.2) == Decimal("0.3")


def test_histogram_quantile_matches_prometheus() -> None:
    buckets = [(0.1, 0.0), (0.2, 50.0), (0.4, 90.0), (math.inf, 100.0)]
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.15)
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.2)
    assert histogram_quantile(0.75, buckets) == pytest.approx(0.325)
    assert histogram_quantile(0.95, buckets) == 0.4  # rank in +Inf: the highest finite bound
    assert math.isnan(histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]))
    assert math.isnan(histogram_quantile(0.5, [(0.1, 3.0)]))  # no +Inf bucket


def test_every_example_threshold_is_a_bucket_bound() -> None:
    assert unbucketed_thresholds(SLOSpec.default()) == []
    assert unbucketed_thresholds(SLOSpec.from_yaml(SHORT)) == []


def test_labels_identify_each_alert() -> None:
    rules = alert_rules(SLOSpec.default())
    keys = [(r.name, tuple(sorted(r.labels.items()))) for r in rules]
    assert len(keys) == len(set(keys))
