"""Arrival processes follow the asked distribution (Kolmogorov-Smirnov), and the lateness
summary says when a client fell behind its schedule."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import numpy as np
import pytest
from scipy import stats

from slo.capacity.arrivals import check_arrival, lateness_of, offsets
from slo.cli.bench.profiles import get_profile, plan_requests
from slo.errors import UsageError

RATE = 25.0
COUNT = 4000


def gaps(kind: str, burstiness: float = 1.0, seed: int = 7) -> list[float]:
    times = offsets(random.Random(seed), COUNT, kind, RATE, burstiness)  # type: ignore[arg-type]
    return [later - earlier for earlier, later in itertools.pairwise(times)]


def ks_statistic(sample: list[float], cdf: Callable[[np.ndarray], np.ndarray]) -> float:
    """sup |F_n - F| at every sample point and just below it: scipy's kstest assumes a
    continuous F, and the constant process has a step."""
    xs = np.sort(np.round(sample, 12))
    n = xs.size
    below = np.nextafter(xs, -np.inf)
    empirical_at = np.searchsorted(xs, xs, side="right") / n
    empirical_below = np.searchsorted(xs, below, side="right") / n
    return float(
        max(np.abs(empirical_at - cdf(xs)).max(), np.abs(empirical_below - cdf(below)).max())
    )


def test_constant_gaps_are_all_one_over_the_rate() -> None:
    def step(x: np.ndarray) -> np.ndarray:
        return (x >= round(1 / RATE, 12)).astype(float)

    assert ks_statistic(gaps("constant"), step) == 0.0
    assert ks_statistic(gaps("poisson"), step) > 0.5  # the statistic can see a difference


def test_the_statistic_agrees_with_scipy_on_a_continuous_distribution() -> None:
    drawn = gaps("poisson")
    ours = ks_statistic(drawn, lambda x: stats.expon.cdf(x, 0, 1 / RATE))
    assert ours == pytest.approx(stats.kstest(drawn, "expon", args=(0, 1 / RATE)).statistic)


def test_poisson_gaps_are_exponential_and_not_gamma_bursty() -> None:
    drawn = gaps("poisson")
    assert stats.kstest(drawn, "expon", args=(0, 1 / RATE)).pvalue > 0.01
    # the test can fail: bursty gaps are no exponential of the same mean
    assert stats.kstest(gaps("gamma", 0.25), "expon", args=(0, 1 / RATE)).pvalue < 1e-6


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_gaps_have_shape_burstiness_and_mean_one_over_the_rate(burstiness: float) -> None:
    drawn = gaps("gamma", burstiness)
    scale = 1 / (RATE * burstiness)
    assert stats.kstest(drawn, "gamma", args=(burstiness, 0, scale)).pvalue > 0.01
    assert sum(drawn) / len(drawn) == pytest.approx(1 / RATE, rel=0.06)
    if burstiness != 1.0:  # and they are not exponential
        assert stats.kstest(drawn, "expon", args=(0, 1 / RATE)).pvalue < 1e-6


def test_plan_requests_spaces_requests_by_the_arrival_process() -> None:
    plan = plan_requests(
        get_profile("voice"), 50, seed=1, max_model_len=4096, rate=10.0, arrival="constant"
    )
    assert [round(p.offset_s, 9) for p in plan] == [round(i / 10, 9) for i in range(50)]
    poisson = plan_requests(get_profile("voice"), 50, seed=1, max_model_len=4096, rate=10.0)
    assert len({round(b.offset_s - a.offset_s, 9) for a, b in itertools.pairwise(poisson)}) > 40


@pytest.mark.parametrize(
    ("kind", "burstiness", "message"),
    [
        ("uniform", 1.0, "--arrival 'uniform': unknown process"),
        ("gamma", 0.0, "--burstiness must be > 0"),
        ("poisson", 2.0, "--burstiness 2 needs --arrival gamma"),
    ],
)
def test_bad_arrivals_are_refused_by_name(kind: str, burstiness: float, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        check_arrival(kind, 1.0, burstiness)


def test_a_client_that_kept_its_schedule_is_not_behind_and_one_that_lagged_is() -> None:
    rate = 100.0
    sent = [i / rate for i in range(200)]
    on_time = lateness_of([0.0002] * 199 + [0.030], sent, rate)  # one stall of a busy machine
    assert not on_time.behind
    assert on_time.p99_s == pytest.approx(0.0002) and on_time.max_s == pytest.approx(0.030)
    lagging = lateness_of([0.004 * i for i in range(200)], [i * 0.014 for i in range(200)], rate)
    assert lagging.behind  # sent at 71 req/s of 100 asked
    assert "fell behind" in lagging.describe()
    bunched = lateness_of([0.0] * 190 + [0.025] * 10, sent, rate)  # 5% of sends 2.5 gaps late
    assert bunched.behind
