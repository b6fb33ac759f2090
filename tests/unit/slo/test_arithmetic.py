"""slo.arithmetic: exact targets, one strict burn-rate comparison, one goodput check."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from slo import arithmetic
from slo.spec.objectives import parse_objective
from slo.units import parse_fraction


def test_targets_are_the_decimals_people_wrote() -> None:
    target = parse_fraction("99.9%")
    assert arithmetic.exact_fraction(target) == Fraction(999, 1000)
    assert arithmetic.exact_fraction(99.9 / 100) == Fraction(999, 1000)
    assert arithmetic.error_budget(target) == Fraction(1, 1000)
    assert arithmetic.exact_fraction(Decimal("0.95")) == Fraction(19, 20)


@pytest.mark.parametrize(
    ("target", "events", "needed"),
    [("99.9%", 1000, 999), ("99.9%", 1001, 1000), ("95%", 20, 19), ("99%", 7, 7), ("50%", 3, 2)],
)
def test_meets_exactly_at_the_required_count(target: str, events: int, needed: int) -> None:
    fraction = parse_fraction(target)
    assert arithmetic.required_good(fraction, events) == needed
    assert arithmetic.meets(needed, events, fraction)
    assert not arithmetic.meets(needed - 1, events, fraction)
    assert arithmetic.verdict(needed, events, fraction, 1) == "met"
    assert arithmetic.verdict(needed - 1, events, fraction, 1) == "violated"


def test_verdict_needs_min_events() -> None:
    assert arithmetic.verdict(9, 9, 0.9, 10) == "insufficient_data"
    assert arithmetic.verdict(0, 0, 0.9, 0) == "insufficient_data"
    assert arithmetic.verdict(9, 10, 0.9, 10) == "met"


def test_fractional_counts_compare_as_given() -> None:
    # increase() estimates: compared exactly, no tolerance either way.
    assert arithmetic.meets(999.0, 1000.0, 0.999)
    assert not arithmetic.meets(998.9999, 1000.0, 0.999)
    assert arithmetic.meets(1248.75, 1250.0, 0.999)  # 999 of 1000 extrapolated by 5/4


@given(st.integers(0, 10_000), st.integers(1, 10_000), st.integers(1, 99_999))
def test_meets_agrees_with_integer_arithmetic(good: int, events: int, per_100k: int) -> None:
    good = min(good, events)
    target = per_100k / 100_000  # a float, with its binary noise
    assert arithmetic.meets(good, events, target) == (good * 100_000 >= per_100k * events)
    assert arithmetic.meets(float(good), float(events), target) == arithmetic.meets(
        good, events, target
    )


def test_burning_is_strictly_above_factor_times_budget() -> None:
    # 99.9%: budget 0.001; x14.4 -> limit 0.0144 = 144 of 10000.
    assert arithmetic.burn_limit(0.999, 14.4) == Fraction(144, 10_000)
    assert not arithmetic.burning(144, 10_000, 0.999, 14.4)
    assert arithmetic.burning(145, 10_000, 0.999, 14.4)
    assert not arithmetic.burning(0, 0, 0.999, 14.4)
    assert arithmetic.BURN_RATE_OPERATOR == ">"
    assert arithmetic.burn_rate(144, 10_000, 0.999) == pytest.approx(14.4)
    assert arithmetic.burn_rate(1, 0, 0.999) is None


def test_burn_rule_needs_every_window_guarded_and_burning() -> None:
    fires = arithmetic.burn_rule_fires
    assert fires([(20, 100), (2, 10)], 0.99, 14.4, 10)
    assert not fires([(20, 100), (2, 9)], 0.99, 14.4, 10)  # short window below the guard
    assert not fires([(20, 100), (0, 10)], 0.99, 14.4, 10)  # short window recovered
    assert not fires([], 0.99, 14.4, 0)
    assert not fires([(0, 0), (0, 0)], 0.99, 1.0, 0)  # no events, never an alert


def test_budget_remaining() -> None:
    assert arithmetic.budget_remaining(999, 1000, 0.999) == 0.0
    assert arithmetic.budget_remaining(1000, 1000, 0.999) == 1.0
    assert arithmetic.budget_remaining(998, 1000, 0.999) == -1.0
    assert arithmetic.budget_remaining(0, 0, 0.999) is None


def test_goodput_checks_skip_per_gap_slis_and_pass_missing_values() -> None:
    objectives = [
        parse_objective("p95 ttft <= 200ms", 1),
        parse_objective("p99 itl <= 50ms", 2),
        parse_objective("p90 tpot < 40ms", 3),
        parse_objective("availability >= 99%", 4),
    ]
    checks = arithmetic.goodput_checks(objectives)
    assert [(c.field, c.threshold_s, c.inclusive) for c in checks] == [
        ("ttft_s", 0.2, True),
        ("tpot_s", 0.04, False),
    ]
    ttft, tpot = checks
    assert ttft.passes(0.2) and not ttft.passes(0.2000001)
    assert not tpot.passes(0.04) and tpot.passes(0.039)
    assert ttft.passes(None) and ttft.passes(math.nan)
    ok = np.array([True, True, True, False])
    good = arithmetic.good_requests(
        ok,
        [
            (ttft, np.array([0.1, 0.3, np.nan, 0.1])),
            (tpot, np.array([0.01, 0.01, np.nan, 0.01])),
        ],
    )
    assert good.tolist() == [True, False, True, False]
    for index, value in enumerate([0.1, 0.3, math.nan, 0.1]):
        assert ttft.passes(value) == bool(ttft.passes_each(np.array([value]))[0]), index


_GOODPUT_CHECKS = arithmetic.goodput_checks(
    [parse_objective("p95 ttft <= 200ms", 1), parse_objective("p90 e2e < 2s", 2)]
)
# On, just above and just below each threshold, missing, and far off.
_VALUES = st.none() | st.sampled_from([0.2, 0.2000001, 0.1999999, 2.0, 1.9999999, 0.0, 50.0])


@given(st.lists(st.tuples(st.booleans(), _VALUES, _VALUES), max_size=20))
def test_one_request_is_good_exactly_when_its_column_says_so(
    requests: list[tuple[bool, float | None, float | None]],
) -> None:
    """`good_request` (the middleware's counter and live windows, per request) and
    `good_requests` (the records, per column) decide alike, request by request."""
    ttft, e2e = _GOODPUT_CHECKS
    ok = np.array([r[0] for r in requests], dtype=bool)
    columns = [
        (check, np.array([np.nan if r[i] is None else r[i] for r in requests], dtype=float))
        for i, check in ((1, ttft), (2, e2e))
    ]
    by_column = arithmetic.good_requests(ok, columns).tolist()
    one_by_one = [
        arithmetic.good_request(good, _GOODPUT_CHECKS, {"ttft_s": t, "e2e_s": e}.get)
        for good, t, e in requests
    ]
    assert one_by_one == by_column


def test_goodput_alerts_on_its_budget_and_throughput_does_not() -> None:
    kinds = ["p95 ttft <= 200ms", "availability >= 99%", "goodput >= 95%"]
    assert all(arithmetic.alerts_on_budget(parse_objective(text, 1)) for text in kinds)
    assert not arithmetic.alerts_on_budget(parse_objective("throughput >= 5 tokens/s", 1))


def test_throughput_meets_at_the_minimum_rate() -> None:
    assert arithmetic.meets_rate(500.0, 500.0)
    assert not arithmetic.meets_rate(499.999, 500.0)
