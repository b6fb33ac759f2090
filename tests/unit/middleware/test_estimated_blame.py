"""Estimated blame in front of any engine (`middleware.request.estimated_blame`, docs/blame.md):
known schedules give the blame the rules say, to the nanosecond; random ones keep every sum;
the estimator keeps an ended request as a culprit exactly as long as a request in flight may
have waited for it; the counter's estimated children are born at 0 and count what a blame
names; the record takes `"estimated": true`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from middleware import ScriptedClock
from middleware.metrics.metric_set import MetricSet
from middleware.request.estimated_blame import BlameEstimator, Seen, estimate_blame
from middleware.request.timeline import RequestTimeline
from slo.engine_slis import DELAY_CAUSES, NO_CULPRIT
from slo.records import RecordError, validate_record
from slo.sli import CATALOG
from slo.spec import SLOSpec

MS = 1_000_000
SPEC = SLOSpec.default()
PREMIUM, BATCH = SPEC.tiers[0].name, SPEC.tiers[-1].name


def by_tier(blame: dict) -> dict[tuple[str, str], float]:
    return {(entry["cause"], entry["tier"]): entry["s"] for entry in blame["by_tier"]}


def ended(request_id: str, tier: str, arrival_ms: float, first_ms: float, end_ms: float) -> Seen:
    return Seen(
        request_id,
        tier,
        round(arrival_ms * MS),
        None,
        None,
        round(first_ms * MS),
        round(end_ms * MS),
    )


def test_a_slow_gap_beside_another_prefill_blames_the_excess_over_the_median_on_its_tier() -> None:
    # Premium's chunks 10 ms apart from 100 ms, but one gap of 50 ms (150 -> 200 ms); a batch
    # request's prefill (its arrival at 140 ms to its first token at 195 ms) overlaps it.
    chunks = [*range(100, 151, 10), *range(200, 301, 10)]
    premium = ended("p", PREMIUM, 0, 100, 300)
    batch = ended("b", BATCH, 140, 195, 400)
    early = ended("e", BATCH, 0, 20, 90)  # its prefill ended before premium's first token
    blame = estimate_blame(premium, [at * MS for at in chunks], 0.0, [batch, early])
    assert by_tier(blame) == {("interference", BATCH): pytest.approx(0.040)}
    assert blame["interference_s"] == pytest.approx(0.040)
    assert blame["decode_s"] == pytest.approx(0.200)
    assert blame["decode_only_s"] == pytest.approx(0.160)
    assert blame["top"] == [
        {"cause": "interference", "request_id": "b", "tier": BATCH, "s": pytest.approx(0.040)}
    ]
    assert blame["estimated"] is True and blame["preempted_s"] == 0.0


def test_a_slow_gap_beside_no_prefill_stays_decode_only() -> None:
    chunks = [100, 110, 120, 170, 180, 190]
    premium = ended("p", PREMIUM, 0, 100, 190)
    later = ended("b", BATCH, 200, 230, 300)  # its prefill is after premium ended
    blame = estimate_blame(premium, [at * MS for at in chunks], 0.0, [later])
    assert blame["interference_s"] == 0.0
    assert blame["decode_only_s"] == pytest.approx(0.090)
    assert blame["by_tier"] == []


def test_a_gap_beside_two_prefills_is_split_by_their_overlap() -> None:
    chunks = [100, 110, 120, 220, 230, 240]  # one 100 ms gap: 120 -> 220; the median is 10
    premium = ended("p", PREMIUM, 0, 100, 240)
    one = ended("b1", BATCH, 100, 150, 400)  # overlaps 120 -> 150: 30 ms
    other = ended("p2", PREMIUM, 160, 220, 400)  # overlaps 160 -> 220: 60 ms
    blame = estimate_blame(premium, [at * MS for at in chunks], 0.0, [one, other])
    assert by_tier(blame) == {
        ("interference", BATCH): pytest.approx(0.090 * 30 / 90),
        ("interference", PREMIUM): pytest.approx(0.090 * 60 / 90),
    }


def test_the_wait_is_split_among_the_requests_in_flight_ahead_of_it() -> None:
    # Premium arrives at 50 ms and waits 100 ms before its 20 ms prefill (first token at
    # 200 ms): its wait is 80 -> 180 ms. Ahead of it: a premium request that ends at 130 ms and
    # a batch request still in flight. 80 -> 130: two ahead, 25 ms each; 130 -> 180: batch.
    request = ended("r", PREMIUM, 50, 200, 300)
    request.prefill_start_ns = 180 * MS
    ahead = [ended("a", PREMIUM, 0, 10, 130), Seen("b", BATCH, 10 * MS, None)]
    behind = Seen("c", BATCH, 60 * MS, None)  # arrived after it: not ahead of it
    blame = estimate_blame(request, [200 * MS], 0.100, [*ahead, behind])
    assert by_tier(blame) == {
        ("queue", PREMIUM): pytest.approx(0.025),
        ("queue", BATCH): pytest.approx(0.075),
    }
    counts = {entry["tier"]: entry["requests"] for entry in blame["by_tier"]}
    assert counts == {PREMIUM: 1, BATCH: 1}
    assert blame["queue_s"] == 0.100


def test_a_wait_with_nobody_ahead_is_blamed_on_nobody() -> None:
    request = ended("r", PREMIUM, 50, 200, 300)
    left = ended("a", BATCH, 0, 10, 60)  # ended before the wait (100 -> 200 ms) began
    blame = estimate_blame(request, [200 * MS], 0.100, [left])
    assert by_tier(blame) == {("queue", NO_CULPRIT): pytest.approx(0.100)}
    assert blame["by_tier"][0]["requests"] == 0


requests = st.lists(
    st.tuples(
        st.integers(0, 500),  # arrival, ms
        st.integers(1, 300),  # to its first token
        st.integers(0, 400),  # to its end
        st.sampled_from([PREMIUM, BATCH]),
        st.booleans(),  # still in flight
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(
    others=requests,
    arrival=st.integers(0, 500),
    gaps=st.lists(st.integers(0, 80), min_size=0, max_size=30),
    wait=st.integers(0, 200),
)
def test_the_sums_hold_on_random_schedules(
    others: list[tuple[int, int, int, str, bool]], arrival: int, gaps: list[int], wait: int
) -> None:
    first = arrival + wait + 5
    chunks = [first]
    for gap in gaps:
        chunks.append(chunks[-1] + gap)
    request = ended("r", PREMIUM, arrival, first, chunks[-1] + 1)
    seen = [
        Seen(f"o{index}", tier, at * MS, None)
        if open_
        else ended(f"o{index}", tier, at, at + to_first, at + to_first + to_end)
        for index, (at, to_first, to_end, tier, open_) in enumerate(others)
    ]
    blame = estimate_blame(request, [at * MS for at in chunks], wait / 1000, seen)
    causes = {cause: 0.0 for cause in DELAY_CAUSES}
    for entry in blame["by_tier"]:
        causes[entry["cause"]] += entry["s"]
        assert entry["s"] >= 0 and entry["requests"] >= 0
    assert causes["queue"] == pytest.approx(wait / 1000, abs=1e-9)
    assert causes["interference"] == pytest.approx(blame["interference_s"], abs=1e-9)
    assert blame["decode_only_s"] + blame["interference_s"] == pytest.approx(blame["decode_s"])
    assert blame["decode_s"] == pytest.approx((chunks[-1] - chunks[0]) / 1000)
    assert causes["preemption"] == 0.0
    assert len(blame["top"]) <= 3
    record = {"request_id": "r", "tier": PREMIUM, "timestamp": 1.0, "e2e_s": 1.0}
    assert validate_record({**record, "delay_blame": blame})["delay_blame"] == blame


def timeline_of(clock: ScriptedClock, request_id: str) -> RequestTimeline:
    return RequestTimeline.begin(request_id, clock)


def finish(timeline: RequestTimeline, first_ms: float, chunks_ms: list[float]) -> None:
    timeline.first_token_byte_ns = round(first_ms * MS)
    timeline.token_chunk_ns = [round(at * MS) for at in chunks_ms]
    timeline.last_byte_ns = round(chunks_ms[-1] * MS)


BREAKDOWN = SimpleNamespace(queue_s=None, queue_prefill_s=0.0, prefill_s=None)


def test_the_estimator_keeps_an_ended_request_while_one_in_flight_overlapped_it() -> None:
    clock = ScriptedClock(start_ns=0)
    estimator = BlameEstimator()
    batch = timeline_of(clock, "b")
    estimator.begin(batch, BATCH)
    clock.ns = 10 * MS
    premium = timeline_of(clock, "p")
    estimator.begin(premium, PREMIUM)
    finish(batch, 30, [30, 40])
    assert estimator.estimate(batch, BREAKDOWN) is not None
    # Premium's slow gap (60 -> 110 ms) overlaps nothing: batch's prefill ended at 30 ms. Its
    # wait (queue_prefill, 10 -> 50 ms) had batch ahead until batch ended at 40 ms.
    finish(premium, 50, [50, 60, 110, 120, 130])
    blame = estimator.estimate(
        premium, SimpleNamespace(**{**vars(BREAKDOWN), "queue_prefill_s": 0.04})
    )
    assert by_tier(blame) == {
        ("queue", BATCH): pytest.approx(0.030),
        ("queue", NO_CULPRIT): pytest.approx(0.010),
    }
    # Nobody is in flight now: the ended requests are forgotten.
    assert not estimator._in_flight and not estimator._ended
    # A request never begun here, or one not wanted, gets no estimate.
    assert estimator.estimate(timeline_of(clock, "x"), BREAKDOWN) is None
    failed = timeline_of(clock, "f")
    estimator.begin(failed, BATCH)
    finish(failed, 200, [200])
    assert estimator.estimate(failed, BREAKDOWN, wanted=False) is None
    assert not estimator._in_flight


def estimated_counts(metrics: MetricSet) -> dict[tuple[str, str, str], float]:
    name = CATALOG["delay_caused"].metric
    return {
        (s.labels["tier"], s.labels["culprit_tier"], s.labels["cause"]): s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == name and s.labels["estimated"] == "true"
    }


def test_the_estimated_children_are_born_at_zero_and_count_what_a_blame_names() -> None:
    metrics = MetricSet(SPEC, "m", CollectorRegistry())
    assert estimated_counts(metrics) == {}
    metrics.engine.bear_estimated()
    names = [tier.name for tier in SPEC.tiers]
    expected = {(t, c, cause): 0.0 for t in names for c in names for cause in DELAY_CAUSES}
    expected |= {(t, NO_CULPRIT, "queue"): 0.0 for t in names}
    assert estimated_counts(metrics) == expected
    request = ended("r", PREMIUM, 50, 200, 300)
    blame = estimate_blame(request, [200 * MS], 0.100, [Seen("b", BATCH, 0, None)])
    metrics.engine.observe_estimated(PREMIUM, blame)
    metrics.engine.observe_estimated(
        PREMIUM, {"by_tier": [{"cause": "queue", "tier": "gone", "s": 1.0}]}
    )
    assert estimated_counts(metrics) == {**expected, (PREMIUM, BATCH, "queue"): pytest.approx(0.1)}


def test_the_record_refuses_an_estimated_flag_that_is_not_a_boolean() -> None:
    request = ended("r", PREMIUM, 50, 200, 300)
    blame = {**estimate_blame(request, [200 * MS], 0.1, []), "estimated": "yes"}
    with pytest.raises(RecordError, match="delay_blame"):
        validate_record(
            {"request_id": "r", "tier": "t", "timestamp": 1.0, "e2e_s": 1.0, "delay_blame": blame}
        )
