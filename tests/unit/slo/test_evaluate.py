from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slo.check.evaluate import evaluate, nearest_rank
from slo.performance import classify, industry_position
from slo.records import validate_record
from slo.spec import SLOSpec
from slo.store.columns import RecordColumns

NOW = 1_700_000_000.0


def spec_with(*objectives: str, min_events: int = 1) -> SLOSpec:
    lines = "\n".join(f"  - {objective}" for objective in objectives)
    return SLOSpec.from_yaml(
        f"min_events: {min_events}\ntiers:\n- name: t\n  objectives:\n{lines}\n"
    )


def record(index: int, **fields: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "request_id": f"r{index}", "timestamp": NOW - 10.0 - index * 0.001, "tier": "t",
        "e2e_s": 1.0,
    }  # fmt: skip
    values.update(fields)
    return validate_record(values)


def columns_of(rows: list[dict[str, Any]]) -> RecordColumns:
    return RecordColumns.from_dicts(rows)


def brute_force_percentile(values: list[float], target: float) -> float:
    """Nearest rank straight from the definition: smallest v with share(x <= v) >= target."""
    ordered = sorted(values)
    for value in ordered:
        if sum(x <= value for x in ordered) >= target * len(ordered) - 1e-9:
            return value
    raise AssertionError("unreachable")


latencies = st.lists(
    st.floats(min_value=0.0, max_value=20.0, allow_nan=False).map(lambda x: round(x, 3)),
    min_size=1,
    max_size=120,
)
targets = st.sampled_from([0.5, 0.9, 0.95, 0.99, 0.999, 0.75, 0.333])
thresholds = st.floats(min_value=0.001, max_value=20.0).map(lambda x: round(x, 3))


@settings(max_examples=200, deadline=None)
@given(latencies, targets)
def test_percentile_equals_brute_force(values: list[float], target: float) -> None:
    assert nearest_rank(np.array(values), target) == brute_force_percentile(values, target)


@settings(max_examples=150, deadline=None)
@given(latencies, targets, thresholds)
def test_attainment_and_verdicts_match_brute_force(
    values: list[float], target: float, threshold: float
) -> None:
    percent = f"{target * 100:g}"
    spec = spec_with(f"p{percent} ttft <= {threshold * 1000:g}ms",
                     f"{percent}% of requests ttft <= {threshold * 1000:g}ms")  # fmt: skip
    rows = [record(i, ttft_s=value, e2e_s=value + 1.0) for i, value in enumerate(values)]
    percentile_form, ratio_form = evaluate(spec, columns_of(rows), now=NOW).tiers[0].objectives
    good = sum(value <= threshold for value in values)
    assert percentile_form.events == ratio_form.events == len(values)
    assert percentile_form.good == good
    assert percentile_form.attainment == pytest.approx(good / len(values))
    assert percentile_form.observed_s == brute_force_percentile(values, target)
    expected = "met" if good / len(values) >= target - 1e-12 else "violated"
    assert percentile_form.verdict == ratio_form.verdict == expected


def test_latency_counts_only_ok_requests_with_a_value() -> None:
    rows = [record(0, ttft_s=0.1), record(1, ttft_s=0.9), record(2, ttft_s=5.0, outcome="timeout"),
            record(3)]  # fmt: skip
    result = evaluate(spec_with("p50 ttft <= 200ms"), columns_of(rows), now=NOW).results[0]
    assert (result.events, result.good, result.observed_s) == (2, 1, 0.1)
    assert result.verdict == "met"


def test_availability_leaves_out_client_errors_and_cancellations() -> None:
    outcomes = ["ok"] * 97 + ["server_error", "rate_limited", "shed"] + ["client_error"] * 50
    rows = [record(i, outcome=o) for i, o in enumerate([*outcomes, "cancelled"])]
    result = evaluate(spec_with("availability >= 97%"), columns_of(rows), now=NOW).results[0]
    assert (result.events, result.good, result.verdict) == (100, 97, "met")
    assert result.budget_remaining == pytest.approx(0.0)
    tighter = evaluate(spec_with("availability >= 98%"), columns_of(rows), now=NOW).results[0]
    assert tighter.verdict == "violated" and tighter.budget_remaining == pytest.approx(-0.5)


def test_goodput_needs_every_latency_objective_and_ok() -> None:
    rows = [
        record(0, ttft_s=0.1, tpot_s=0.01),
        record(1, ttft_s=0.5, tpot_s=0.01),  # slow first token
        record(2, ttft_s=0.1, tpot_s=0.09),  # slow tokens
        record(3, ttft_s=0.1),  # one-token reply: no tpot, still good
        record(4, ttft_s=0.1, tpot_s=0.01, outcome="server_error"),
    ]
    spec = spec_with("p50 ttft <= 200ms", "p50 tpot <= 50ms", "goodput >= 40%")
    goodput = evaluate(spec, columns_of(rows), now=NOW).results[2]
    assert (goodput.events, goodput.good, goodput.verdict) == (5, 2, "met")


def test_client_view_wins_where_present() -> None:
    rows = [record(0, ttft_s=0.05, client_ttft_s=0.3), record(1, ttft_s=0.05)]
    report = evaluate(spec_with("p99 ttft <= 100ms"), columns_of(rows), now=NOW)
    result = report.results[0]
    assert result.observed_s == 0.3 and result.verdict == "violated"
    assert result.client_view_events == 1 and report.view == "mixed"


def test_itl_counts_every_gap() -> None:
    rows = [record(0, itl_s=[0.01, 0.02, 0.2]), record(1, itl_s=[0.01])]
    result = evaluate(spec_with("p75 itl <= 50ms"), columns_of(rows), now=NOW).results[0]
    assert (result.events, result.good, result.verdict) == (4, 3, "met")


def test_burn_rate_per_window_and_multiwindow_alert() -> None:
    # 20 requests in the last 5 minutes, all bad; 80 older good ones within the hour.
    rows = [record(i, ttft_s=1.0, timestamp=NOW - 60 - i) for i in range(20)]
    rows += [record(100 + i, ttft_s=0.01, timestamp=NOW - 600 - i * 10) for i in range(80)]
    result = evaluate(spec_with("p90 ttft <= 100ms"), columns_of(rows), now=NOW).results[0]
    burn = {b.window_s: b for b in result.burn}
    assert (burn[300.0].events, burn[300.0].bad) == (20, 20)
    assert burn[300.0].burn_rate == pytest.approx(10.0)
    assert burn[3600.0].burn_rate == pytest.approx(2.0)
    assert result.alerts == ("ticket 3d/6h x1",)


def test_insufficient_data_and_window() -> None:
    rows = [record(0, ttft_s=0.1), record(1, ttft_s=0.1, timestamp=NOW - 40 * 86400)]
    report = evaluate(spec_with("p95 ttft <= 1s", min_events=2), columns_of(rows), now=NOW)
    assert report.results[0].verdict == "insufficient_data"
    assert report.records == 1 and "outside the 30d window" in report.notes[0]
    empty = evaluate(spec_with("p95 ttft <= 1s"), RecordColumns.empty(), now=NOW)
    assert empty.results[0].verdict == "insufficient_data" and not empty.all_met


def test_records_of_unknown_tiers_are_reported_not_evaluated() -> None:
    rows = [record(0, ttft_s=0.1), record(1, ttft_s=9.0, tier="ghost")]
    report = evaluate(spec_with("p99 ttft <= 1s"), columns_of(rows), now=NOW)
    assert report.all_met and "ghost" in report.notes[0]


def test_record_objects_and_columns_give_the_same_report() -> None:
    from slo.records import RequestRecord

    rows = [record(i, ttft_s=i / 100, tpot_s=0.02, output_tokens=10) for i in range(50)]
    spec = SLOSpec.default()
    spec_rows = [dict(row, tier="premium") for row in rows]
    from_objects = evaluate(spec, [RequestRecord(**row) for row in spec_rows], now=NOW)
    from_columns = evaluate(spec, columns_of(spec_rows), now=NOW)
    assert from_objects.to_dict() == from_columns.to_dict()


@pytest.mark.parametrize(
    ("ttft", "tpot", "tokens_per_s", "tier"),
    [
        (0.08, 0.015, None, "Ultra Low Latency"),
        (0.15, 0.025, 1500.0, "High Performance"),
        (0.4, 0.04, 800.0, "Optimized"),
        (1.5, 0.08, 300.0, "Basic"),
        (3.0, 0.08, 5000.0, "Cost Optimized"),
        (6.0, 0.2, 100.0, "below Basic"),
    ],
)
def test_performance_tiers(ttft: float, tpot: float, tokens_per_s: float | None, tier: str) -> None:
    assert classify(ttft, tpot, tokens_per_s).tier == tier


def test_industry_position() -> None:
    assert industry_position("ttft", 95, 0.05) == "world class"
    assert industry_position("ttft", 95, 0.45) == "typical"
    assert industry_position("ttft", 99, 2.0) == "worse than typical"
    assert industry_position("ttft", 90, 0.1) == "no industry figure"
    assert math.isnan(nearest_rank(np.array([]), 0.5))
