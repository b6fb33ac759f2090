"""The industry performance tiers hold every bound, the throughput floor included, and the
reason says which bound kept a run from a faster tier."""

from __future__ import annotations

from typing import Any

import pytest

from slo.check.evaluate import evaluate
from slo.performance import BELOW_BASIC, LATENCY_TIERS, PerformanceTier, classify
from slo.records import validate_record
from slo.spec import SLOSpec
from slo.store.columns import RecordColumns

NOW = 1_700_000_000.0
TIER_NAMES = [tier.name for tier in LATENCY_TIERS]


def within(tier: PerformanceTier) -> tuple[float, float]:
    """p95 TTFT and TPOT inside the tier's latency bounds (and every slower tier's)."""
    return tier.ttft_max_s * 0.9, tier.tpot_max_s * 0.9


@pytest.mark.parametrize("tier", LATENCY_TIERS, ids=TIER_NAMES)
def test_each_tier_needs_its_throughput_floor(tier: PerformanceTier) -> None:
    ttft, tpot = within(tier)
    assert classify(ttft, tpot, tier.min_tokens_per_s).tier == tier.name
    below = classify(ttft, tpot, tier.min_tokens_per_s * 0.9)
    assert below.tier != tier.name
    # Below Basic, the slowest tier, is named once: "below Basic: ..."
    named = ": " if tier is LATENCY_TIERS[-1] else f"; not {tier.name}: "
    assert f"{named}{tier.min_tokens_per_s * 0.9:.0f} tokens/s below its floor" in below.reason


def test_ten_tokens_a_second_is_no_ultra_low_latency() -> None:
    fastest = LATENCY_TIERS[0]
    result = classify(*within(fastest), 10.0)
    assert result.tier == BELOW_BASIC, result
    assert f"not {fastest.name}: 10 tokens/s below its floor" in result.reason


def test_a_run_that_misses_a_floor_falls_to_the_tier_whose_floor_it_meets() -> None:
    by_name = {tier.name: tier for tier in LATENCY_TIERS}
    high, optimized = by_name["High Performance"], by_name["Optimized"]
    assert optimized.min_tokens_per_s < high.min_tokens_per_s
    rate = (optimized.min_tokens_per_s + high.min_tokens_per_s) / 2
    result = classify(*within(high), rate)
    assert result.tier == "Optimized", result
    assert f"not High Performance: {rate:.0f} tokens/s below its floor" in result.reason


@pytest.mark.parametrize(("bound", "words"), [(0, "p95 TTFT above"), (1, "p95 TPOT above")])
def test_the_reason_names_the_latency_bound_that_failed(bound: int, words: str) -> None:
    fastest, next_one = LATENCY_TIERS[0], LATENCY_TIERS[1]
    figures = list(within(fastest))
    figures[bound] = within(next_one)[bound]
    result = classify(*figures, next_one.min_tokens_per_s)
    assert result.tier == next_one.name, result
    assert f"not {fastest.name}: {words}" in result.reason


def test_slo_check_reads_a_slow_trickle_as_below_basic() -> None:
    """20 fast requests, one a second, 10 tokens each: 10 tokens/s of the run."""
    rows = [
        validate_record(
            {
                "request_id": f"r{index}",
                "timestamp": NOW - 30.0 + index,
                "tier": "t",
                "ttft_s": 0.05,
                "tpot_s": 0.01,
                "e2e_s": 0.14,
                "output_tokens": 10,
            }
        )
        for index in range(20)
    ]
    spec = SLOSpec.from_yaml("tiers:\n- name: t\n  objectives: [p95 ttft <= 1s]\n")
    report: Any = evaluate(spec, RecordColumns.from_dicts(rows), now=NOW)
    performance = report.tiers[0].performance
    assert performance.tokens_per_s == pytest.approx(200 / 19.14)
    assert performance.tier == BELOW_BASIC, performance
    assert f"not {LATENCY_TIERS[0].name}: 10 tokens/s below its floor" in performance.reason
