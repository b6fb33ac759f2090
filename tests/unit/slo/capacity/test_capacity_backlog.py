"""A step's backlog: requests in flight at the first and last measured send, and whether the
server kept up, against queues whose answer is known."""

from __future__ import annotations

import heapq
import random

import pytest

from slo.capacity.backlog import STEADY_STATE, backlog_of, judge_backlogs
from slo.capacity.judge import TierStep
from slo.capacity.result import per_tier


def test_in_flight_is_sent_less_finished_at_each_end_of_the_window() -> None:
    sends = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    finishes = [0.5, 3.5, 2.5, 6.0, 9.0]  # the last request never finished
    backlog = backlog_of(sends, finishes, (1.0, 4.0))
    assert backlog is not None
    # At 1.0: sent 0 and 1, finished 0 -> 1. At 4.0: sent 0..4, finished 0, 2, 1 -> 2.
    assert (backlog.at_start, backlog.at_end, backlog.growth, backlog.sent) == (1, 2, 1, 3)
    # In flight at the measured sends 1, 2, 3, 4: 1, 2, 2, 2.
    assert backlog.mean_in_flight == pytest.approx(1.75)
    assert backlog.allowed_growth == pytest.approx(0.05 * 3 + 3.0 * 1.75**0.5)
    assert backlog.kept_up
    assert backlog_of([], [], (0.0, 1.0)) is None
    assert backlog_of([1.0], [2.0], (1.0, 1.0)) is None


def _queue(rate: float, slots: int, hold_s: float, count: int, seed: int) -> tuple[list, list]:
    """Poisson arrivals into `slots` servers holding each request `hold_s`, first come first
    served: (send times, finish times)."""
    rng = random.Random(seed)
    sends, t = [], 0.0
    for _ in range(count):
        sends.append(t)
        t += rng.expovariate(rate)
    free = [0.0] * slots
    finishes = []
    for sent in sends:
        start = max(sent, heapq.heappop(free))
        heapq.heappush(free, start + hold_s)
        finishes.append(start + hold_s)
    return sends, finishes


def _kept_up(load: float, seed: int) -> bool:
    slots, hold_s, count = 8, 0.2, 1000  # capacity 40 req/s: a step of 25 s at 40 req/s
    sends, finishes = _queue(load * slots / hold_s, slots, hold_s, count, seed)
    warmup = count // 6
    backlog = backlog_of(sends, finishes, (sends[warmup], sends[-1]))
    assert backlog is not None
    return backlog.kept_up


@pytest.mark.parametrize("seed", range(20))
def test_a_server_with_room_keeps_up_and_a_quarter_past_capacity_does_not(seed: int) -> None:
    assert _kept_up(0.8, seed)
    assert _kept_up(0.9, seed)
    assert not _kept_up(1.25, seed)


def test_a_tier_that_fell_behind_fails_on_the_steady_state_and_is_bound_by_it() -> None:
    met = {"objective": "p90 e2e <= 5s", "verdict": "met", "severity": 0.6,
           "observed_s": 3.0, "threshold_s": 5.0}  # fmt: skip
    tiers = {
        "premium": TierStep("premium", 100, "pass", [dict(met)]),
        "standard": TierStep("standard", 100, "pass", [dict(met)]),
    }
    behind, steady = _queue(60, 8, 0.2, 400, 1), _queue(20, 8, 0.2, 400, 1)
    backlogs = {
        "premium": backlog_of(*steady, (steady[0][50], steady[0][-1])),
        "standard": backlog_of(*behind, (behind[0][50], behind[0][-1])),
    }
    judge_backlogs(tiers, {name: b for name, b in backlogs.items() if b is not None})
    assert tiers["premium"].verdict == "pass"
    assert tiers["standard"].verdict == "fail"
    assert tiers["standard"].binding is not None
    assert tiers["standard"].binding["objective"] == STEADY_STATE
    step = {"rate": 30.0, "verdict": "fail",
            "tiers": {name: tier.to_dict() for name, tier in tiers.items()}}  # fmt: skip
    passed = {"rate": 20.0, "verdict": "pass",
              "tiers": {name: TierStep(name, 100, "pass", [dict(met)]).to_dict()
                        for name in tiers}}  # fmt: skip
    found = per_tier([passed, step], "rate")
    assert found["standard"] == {**found["standard"], "max_rate": 20.0,
                                 "binding_objective": STEADY_STATE}  # fmt: skip
    assert found["premium"]["max_rate"] == 30.0
