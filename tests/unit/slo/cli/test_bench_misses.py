"""A request that failed or timed out missed its objective: in `slo bench`'s attainment, in the
capacity search's verdicts and early stop, and in goodput."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from slo.capacity.judge import ClearMiss, judge_step
from slo.check.evaluate import evaluate
from slo.check.misses import evaluate_counting_failures
from slo.check.summary import columns_of, good_requests
from slo.cli.bench.step import StepReport, _rates
from slo.cli.bench.verdicts import render_objectives
from tests.helpers.tier_specs import make_tier, spec

# Latency objectives only: no availability objective catches the failures for them.
SPEC = spec(
    make_tier("premium", "p95 ttft <= 200ms", "95% of requests e2e <= 2s", "goodput >= 90%"),
    make_tier("standard", "p95 ttft <= 500ms", default=True),
    window=None,
)


def record(index: int, outcome: str = "ok", tier: str = "premium") -> dict[str, Any]:
    row: dict[str, Any] = {
        "request_id": f"r{index}",
        "timestamp": 100.0 + index,
        "tier": tier,
        "outcome": outcome,
        "e2e_s": 1.0,
        "client_e2e_s": 1.0,
    }
    if outcome == "ok":
        row.update(ttft_s=0.05, client_ttft_s=0.05 + index / 1000)
    return row


def fast_with(failures: int, outcome: str = "timeout", answered: int = 18) -> list[dict]:
    rows = [record(i) for i in range(answered)]
    return rows + [record(answered + i, outcome) for i in range(failures)]


def latency_results(report: Any, tier: str = "premium") -> dict[str, Any]:
    (found,) = [t for t in report.tiers if t.name == tier]
    return {r.objective.name: r for r in found.objectives if r.objective.kind == "latency"}


@pytest.mark.parametrize("outcome", ["timeout", "server_error", "shed", "rate_limited"])
def test_a_failed_request_is_a_latency_miss_in_the_step_verdict(outcome: str) -> None:
    # 18 fast answers and 2 failures: 90% of premium's requests within 200 ms, under p95.
    rows = fast_with(2, outcome)
    tier = judge_step(SPEC, rows)["premium"]
    verdicts = {o["objective"]: o for o in tier.objectives}
    assert tier.verdict == "fail"
    ttft = verdicts["p95 ttft <= 200ms"]
    assert ttft["verdict"] == "violated" and ttft["attainment"] == pytest.approx(18 / 20)
    assert ttft["observed_s"] is None  # the 19th of 20 is a failure: no latency to show
    assert ttft["severity"] == pytest.approx((2 / 20) / (1 - 0.95))  # bad share over budget
    e2e = verdicts["95% of requests e2e <= 2s"]
    assert e2e["verdict"] == "violated" and e2e["attainment"] == pytest.approx(18 / 20)
    # The answers alone pass: the failures are what the judge now counts.
    assert judge_step(SPEC, rows[:18])["premium"].verdict == "pass"


def test_slo_check_still_judges_latency_over_the_answers() -> None:
    columns = columns_of(fast_with(2))
    answered = latency_results(evaluate(SPEC, columns))["p95 ttft <= 200ms"]
    counted = latency_results(evaluate_counting_failures(SPEC, columns))["p95 ttft <= 200ms"]
    assert (answered.events, answered.good, answered.verdict) == (18, 18, "met")
    assert (counted.events, counted.good, counted.verdict) == (20, 18, "violated")


def test_a_failure_within_the_budget_still_passes_and_ranks_last() -> None:
    rows = fast_with(1, answered=39)  # 39 of 40 within: 97.5%, over p95
    result = latency_results(evaluate_counting_failures(SPEC, columns_of(rows)))
    ttft = result["p95 ttft <= 200ms"]
    assert (ttft.events, ttft.good, ttft.verdict) == (40, 39, "met")
    answers = np.array([r["client_ttft_s"] for r in rows if r["outcome"] == "ok"])
    assert ttft.observed_s == np.sort(answers)[37]  # rank ceil(0.95 * 40) = 38 of 40


def test_the_clients_bad_requests_and_walkaways_are_not_misses() -> None:
    rows = [*fast_with(1, "client_error"), record(30, "cancelled")]
    assert judge_step(SPEC, rows)["premium"].verdict == "pass"
    ttft = latency_results(evaluate_counting_failures(SPEC, columns_of(rows)))["p95 ttft <= 200ms"]
    assert ttft.events == 18


def test_the_step_stops_once_failures_spend_a_latency_budget() -> None:
    miss = ClearMiss(SPEC, {"premium": 20})  # p95 of 20 allows one miss
    for index in range(5):
        assert not miss(record(index))
    assert not miss(record(5, "timeout"))
    assert miss(record(6, "server_error"))
    assert miss.missed == ("premium", "p95 ttft <= 200ms")
    walkaways = ClearMiss(SPEC, {"premium": 20})
    assert not any(walkaways(record(i, "client_error")) for i in range(5))


def test_goodput_counts_a_failure_as_a_request_that_was_not_good() -> None:
    rows = fast_with(2)
    good = good_requests(SPEC, columns_of(rows))
    assert good.tolist() == [True] * 18 + [False] * 2
    report = StepReport(0, 1.0, "rate", "pass", {}, rows)
    _rates(SPEC, report)
    span = max(r["timestamp"] + r["client_e2e_s"] for r in rows) - rows[0]["timestamp"]
    assert report.goodput_rps == round(18 / span, 4)  # 18 good of 20 sent
    results = evaluate_counting_failures(SPEC, columns_of(rows)).results
    (goodput,) = [r for r in results if r.objective.kind == "goodput"]
    assert (goodput.events, goodput.good) == (20, 18)


def test_the_bench_summary_shows_each_objective_with_its_failures() -> None:
    text = " ".join(render_objectives(SPEC, columns_of(fast_with(2))).split())
    assert "objectives, a failed request a miss" in text
    assert "│ premium │ p95 ttft <= 200ms │ 20 │ 2 │ 90.0% │ a failure │ violated │" in text
    assert "│ premium │ goodput >= 90% │ 20 │ 2 │ 90.0% │ - │ met │" in text
