"""Tier isolation judged (slo.isolation): pooled rounds, ratios and the goals, on scripted runs."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from slo.isolation import goals_missed, pool_runs, summarize, summarize_rounds
from slo.spec import SLOSpec
from tests.helpers.tier_specs import premium_batch_spec

SPEC = SLOSpec.from_yaml(premium_batch_spec("p95 ttft <= 100ms"), source="test spec")


@dataclass
class Request:
    tier: str
    ttft_s: float | None = 0.01
    itl_s: list[float] = field(default_factory=lambda: [0.001])
    e2e_s: float | None = 1.0
    output_tokens: int = 10
    outcome: str = "ok"
    tpot_s: float | None = 0.001


@dataclass
class Run:
    policy: str
    wall_s: float
    requests: list[Request]


def premium(ttft_s: float, count: int = 1) -> list[Request]:
    return [Request("premium", ttft_s=ttft_s) for _ in range(count)]


def test_pooling_takes_percentiles_over_every_rounds_requests() -> None:
    # Each round alone: 19 fast premium requests and one slow one, so a round's p95 (nearest
    # rank: the 19th of 20) is fast; two rounds' slow requests pooled are still 5% of 40.
    rounds = [
        (
            Run("fifo", 10.0, premium(0.002, 19) + premium(0.006)),
            [Run("slo", 10.0, [*premium(0.004, 20), Request("batch", output_tokens=100)])],
        )
        for _ in range(2)
    ]
    pooled = pool_runs([alone for alone, _ in rounds])
    assert pooled.wall_s == 20.0 and len(pooled.requests) == 40
    (row,) = summarize_rounds(rounds, SPEC)
    assert row.policy == "slo"
    assert row.premium_ttft_p95_s == pytest.approx(0.004)
    assert row.ttft_ratio == pytest.approx(2.0)  # 4 ms against the pooled alone's 2 ms
    assert row.batch_tokens_per_s == pytest.approx(200 / 20.0)


def test_goals_judge_latency_batch_share_and_goodput_against_fifo() -> None:
    alone = Run("fifo", 10.0, premium(0.002, 20))
    fifo = Run("fifo", 10.0, premium(0.5, 20) + [Request("batch", output_tokens=1000)] * 10)
    slo_ok = Run("slo", 10.0, premium(0.005, 20) + [Request("batch", output_tokens=1000)] * 9)
    slo_slow = Run("slo", 10.0, premium(0.007, 20) + [Request("batch", output_tokens=1000)] * 7)
    fifo_row, ok_row, slow_row = summarize(alone, [fifo, slo_ok, slo_slow], SPEC)
    assert goals_missed(ok_row, fifo_row) == []
    missed = goals_missed(slow_row, fifo_row)
    assert any("TTFT 3.5x" in goal for goal in missed)  # 7 ms against 2 ms
    assert any("batch tokens/s 70%" in goal for goal in missed)
    # fifo's premium requests all missed 100 ms: its goodput is its 10 batch requests a second
    assert fifo_row.goodput_rps == pytest.approx(1.0)
    assert ok_row.goodput_rps == pytest.approx(2.9)
