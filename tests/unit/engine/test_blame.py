"""Exact blame (engine/blame.py): a scripted schedule with known queueing, interference and
preemption gives its exact figures, and on random schedules every sum holds and every figure
equals a plain, eager reading of the rules (tests/helpers/blame_schedules.py).

The scheduler is driven step by step on a scripted clock with no model, as in
test_tier_scheduling.py.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.blame import (
    BLAME_CAUSES,
    INTERFERENCE,
    PREEMPTION,
    QUEUE,
    TOP_CULPRITS,
    RequestBlame,
)
from engine.kv_cache import BlockAllocator
from engine.policies import TierObjective, create_policy
from engine.scheduler import Scheduler
from slo.engine_slis import DELAY_CAUSES
from slo.records import BLAME_TOTALS
from slo.records import TOP_CULPRITS as RECORD_TOP_CULPRITS
from tests.helpers.blame_schedules import (
    Expected,
    ScriptedEngine,
    by_tier,
    expected_by_tier,
)
from tests.helpers.scheduler_steps import BLOCK, make_sequence

MS = 1_000_000  # ns
# The scripted steps cost what the step-time model says: base + per prefill token + per decode.
BASE_MS, TOKEN_MS, DECODE_MS = 2.0, 0.25, 1.0
PREMIUM, BATCH = 0, 2


def step_ms(prefill_tokens: int, decodes: int) -> float:
    return BASE_MS + TOKEN_MS * prefill_tokens + DECODE_MS * decodes


def make_scheduler(policy: str = "priority", **limits: int) -> Scheduler:
    objectives = {0: TierObjective(ttft_s=0.05, tpot_s=0.02), 1: TierObjective(ttft_s=0.2)}
    return Scheduler(
        BlockAllocator(limits.get("num_blocks", 64)),
        BLOCK,
        limits.get("max_batch_size", 2),
        limits.get("budget", 16),
        policy=create_policy(policy, objectives=objectives),
    )


def teach_step_time(scheduler: Scheduler) -> None:
    """The ledger's step-time model, shown steps that cost exactly `step_ms`."""
    assert scheduler.blame is not None
    for tokens in (0, 4, 8, 16):
        for decodes in (0, 1, 2):
            cost = step_ms(tokens, decodes) / 1e3
            scheduler.blame.step_time.observe(tokens, cost, decodes)


def test_causes_and_totals_agree_with_the_catalog_and_the_record() -> None:
    assert BLAME_CAUSES == DELAY_CAUSES
    assert TOP_CULPRITS == RECORD_TOP_CULPRITS
    assert set(BLAME_TOTALS) <= set(RequestBlame.__dataclass_fields__)


# ------------------------------------------------------------------- a known schedule
def known_schedule() -> dict[str, RequestBlame]:
    """Batch B decodes throughout. Premium P waits for B's prefill; batch C waits for B and
    P (the batch is full); C's prefill rides with B's decode; premium Q preempts C; C comes
    back once Q is done. Every step costs `step_ms`, so B's interference is exactly the
    chunks' tokens' part of its steps."""
    scheduler = make_scheduler()
    teach_step_time(scheduler)
    engine = ScriptedEngine(scheduler)
    b = make_sequence("B", BATCH, 8, 0, 0, max_tokens=50)
    p = make_sequence("P", PREMIUM, 4, 1, 0, max_tokens=3)
    c = make_sequence("C", BATCH, 12, 2, 0, max_tokens=2)
    q = make_sequence("Q", PREMIUM, 4, 3, 0, max_tokens=2)
    now = 0.0

    def step(tokens: int, decodes: int) -> None:
        nonlocal now
        end = now + step_ms(tokens, decodes)
        plan = engine.step(int(now * MS), int(now * MS), int(end * MS))
        assert (plan.prefill_tokens, len(plan.decodes)) == (tokens, decodes)
        now = end

    engine.arrive(b, 0)
    step(8, 0)  # 0-4: B's prompt
    engine.arrive(p, 1 * MS)
    step(4, 1)  # 4-8: P admitted (waited 3 ms behind B's prompt), B decodes
    engine.arrive(c, 6 * MS)
    step(0, 2)  # 8-12: the batch is full, C waits
    step(0, 2)  # 12-16: P's last token
    step(12, 1)  # 16-22: C admitted (waited 10 ms), its prompt beside B's decode
    engine.arrive(q, 20 * MS)
    step(4, 1)  # 22-26: Q preempts C, its prompt beside B's decode
    step(0, 2)  # 26-30: Q's last token
    step(13, 1)  # 30-36.25: C again (its prompt and first token), finished
    engine.abort(b, 40 * MS)
    return engine.blames


def approx_table(blame: RequestBlame) -> dict[tuple[str, int | None], tuple[float, int]]:
    return {(c, p): (pytest.approx(s / 1e-3), n) for c, p, s, n in blame.by_tier}


def test_a_known_schedule_gives_its_exact_blame() -> None:
    blames = known_schedule()
    p, c, q, b = blames["P"], blames["C"], blames["Q"], blames["B"]
    # P waited 1..4 ms behind B's prompt: all of it B's.
    assert p.queue_s == pytest.approx(3e-3)
    assert approx_table(p) == {(QUEUE, BATCH): (3.0, 1)}
    assert p.decode_s == pytest.approx(8e-3) and p.interference_s == pytest.approx(0)
    # C waited 6..16 ms: 6..8 behind B's decode (1 token) and P's prompt (4 tokens), then
    # behind both decoding, a token each; then preempted 22..30 for Q.
    assert c.queue_s == pytest.approx(10e-3)
    assert approx_table(c) == {
        (QUEUE, PREMIUM): (1.6 + 2 + 2, 1),
        (QUEUE, BATCH): (0.4 + 2 + 2, 1),
        (PREEMPTION, PREMIUM): (8.0, 1),
    }
    assert c.preempted_s == pytest.approx(8e-3)
    assert [(cause, who) for cause, who, _, _ in c.top] == [
        (PREEMPTION, "Q"),
        (QUEUE, "P"),
        (QUEUE, "B"),
    ]
    # Q waited 20..22 behind B's decode and C's 12-token prompt.
    assert approx_table(q) == {(QUEUE, BATCH): (2.0, 2)}
    assert {who: s / 1e-3 for _, who, _, s in q.top} == {
        "C": pytest.approx(24 / 13),
        "B": pytest.approx(2 / 13),
    }
    # B decoded in every step from the second: beside P's, C's, Q's and C's prompts again,
    # each costing its tokens' part of the step.
    assert b.queue_s == 0
    assert b.decode_s == pytest.approx(32.25e-3)
    assert b.interference_s == pytest.approx((4 + 12 + 4 + 13) * TOKEN_MS * 1e-3)
    assert b.decode_only_s + b.interference_s == pytest.approx(b.decode_s)
    assert approx_table(b) == {
        (INTERFERENCE, PREMIUM): (1.0 + 1.0, 2),
        (INTERFERENCE, BATCH): (3.0 + 3.25, 1),
    }
    assert b.top[0][:2] == (INTERFERENCE, "C")


def test_a_request_ending_inside_its_step_counts_the_step_to_its_end() -> None:
    scheduler = make_scheduler()
    teach_step_time(scheduler)
    engine = ScriptedEngine(scheduler)
    b = make_sequence("B", BATCH, 4, 0, 0, max_tokens=2)
    engine.arrive(b, 0)
    engine.step(0, 0, 3 * MS)
    late = make_sequence("late", BATCH, 8, 1, 0, max_tokens=1)
    engine.arrive(late, 3 * MS)
    # B's last token comes 1 ms into a 4 ms step (the prefill beside it costs 2 ms).
    engine.step(3 * MS, 3 * MS, 7 * MS, finish_at=lambda s: 4 * MS if s is b else 7 * MS)
    assert engine.blames["B"].decode_s == pytest.approx(1e-3)
    assert engine.blames["B"].interference_s == pytest.approx(0)  # within its decode-only cost


def test_blame_off_records_nothing() -> None:
    scheduler = Scheduler(BlockAllocator(16), BLOCK, 2, 16, blame=False)
    sequence = make_sequence("r", 0, 4, 0, 0)
    scheduler.add(sequence)
    scheduler.schedule(0)
    assert sequence.blame is None and scheduler.close_blame(sequence, 1) is None


# -------------------------------------------------------------------- random schedules
REQUEST = st.tuples(
    st.sampled_from([0, 1, 2]),  # priority
    st.integers(1, 40),  # prompt tokens
    st.integers(1, 6),  # max tokens
    st.integers(0, 12),  # the step before which it arrives
    st.floats(0, 1),  # where it arrives since the previous step began
)
STEP = st.tuples(
    st.integers(0, 2 * MS),  # start to plan
    st.integers(1, 20 * MS),  # plan to end
    st.integers(0, 5 * MS),  # end to the next start (idle time)
    st.floats(0, 1),  # where in the step a request it finishes ends
)


@st.composite
def schedules(draw: st.DrawFn) -> dict[str, RequestBlame | Expected]:
    """A random schedule run to its end (aborting what is left), its blames and their
    reference figures."""
    scheduler = make_scheduler(
        draw(st.sampled_from(["fifo", "priority", "slo"])),
        num_blocks=draw(st.integers(13, 40)),  # room for the longest request, or a few
        max_batch_size=draw(st.integers(1, 4)),
        budget=draw(st.integers(1, 24)),
    )
    requests = draw(st.lists(REQUEST, min_size=1, max_size=12))
    steps = draw(st.lists(STEP, min_size=1, max_size=40))
    aborts = draw(st.sets(st.tuples(st.integers(0, 11), st.integers(0, 40)), max_size=3))
    engine = ScriptedEngine(scheduler)
    made = [
        make_sequence(f"r{i}", priority, prompt, i, 0, max_tokens=tokens)
        for i, (priority, prompt, tokens, _, _) in enumerate(requests)
    ]
    now = previous = 0
    run = steps * 3
    for index, (to_plan, to_end, idle, where) in enumerate(run):
        for sequence, (_, _, _, arrives, fraction) in zip(made, requests, strict=True):
            if arrives % len(run) == index:
                engine.arrive(sequence, previous + int((now - previous) * fraction))
        live = scheduler.all_sequences()
        for victim, at in aborts:
            if at == index and victim < len(made) and made[victim] in live:
                engine.abort(made[victim], now)
        plan_ns, end_ns = now + to_plan, now + to_plan + to_end
        ends_at = plan_ns + int(to_end * where)
        engine.step(now, plan_ns, end_ns, lambda _, at=ends_at: at)
        previous, now = now, end_ns + idle
    for sequence in made:
        if sequence.request_id in engine.expected and sequence.request_id not in engine.blames:
            engine.abort(sequence, now)
    return {**engine.blames, **{f"expected {k}": v for k, v in engine.expected.items()}}


def close(value: float) -> object:
    return pytest.approx(value, rel=1e-9, abs=1e-12)


def check_sums(blame: RequestBlame, expected: Expected) -> None:
    """Queue blame sums to the wait the marks say, preemption to the time preempted,
    interference and decode-only to the decode steps' time; each tier's share is the
    reference's."""
    assert expected.schedule_ns is not None
    assert blame.queue_s == close((expected.schedule_ns - expected.enqueue_ns) * 1e-9)
    assert sum(by_tier(blame, QUEUE).values()) == close(blame.queue_s)
    assert by_tier(blame, QUEUE) == {
        tier: close(s) for tier, s in expected_by_tier(expected.queue).items()
    }
    assert blame.preempted_s == close(expected.preempted_s)
    assert sum(by_tier(blame, PREEMPTION).values()) == close(blame.preempted_s)
    assert blame.decode_s == close(expected.decode_s)
    assert blame.decode_only_s == close(expected.decode_only_s)
    assert blame.decode_only_s + blame.interference_s == close(blame.decode_s)
    assert sum(by_tier(blame, INTERFERENCE).values()) == close(blame.interference_s)
    assert by_tier(blame, INTERFERENCE) == {
        tier: close(s) for tier, s in expected_by_tier(expected.interference).items()
    }


def check_culprits(blame: RequestBlame, expected: Expected) -> None:
    """Each tier counts its distinct culprits; the top culprits are the largest, exactly."""
    reference = {(QUEUE, who): s for (who, _), s in expected.queue.items() if who is not None}
    reference |= {(INTERFERENCE, who): s for (who, _), s in expected.interference.items()}
    for cause, table in ((QUEUE, expected.queue), (INTERFERENCE, expected.interference)):
        counts: dict[int | None, int] = {}
        for who, tier in table:
            counts[tier] = counts.get(tier, 0) + (who is not None)
        assert {t: n for c, t, _, n in blame.by_tier if c == cause} == counts
    assert len(blame.top) <= 3
    seconds = [s for _, _, _, s in blame.top]
    assert seconds == sorted(seconds, reverse=True)
    for cause, who, _, s in blame.top:
        if cause != PREEMPTION:
            assert s == close(reference[(cause, who)])
    if len(blame.top) == 3:
        top = {(cause, who) for cause, who, _, _ in blame.top}
        left_out = [s for key, s in reference.items() if key not in top]
        assert all(s <= seconds[-1] * (1 + 1e-9) + 1e-12 for s in left_out)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules())
def test_every_sum_holds_on_random_schedules(run: dict[str, RequestBlame | Expected]) -> None:
    blames = {k: v for k, v in run.items() if isinstance(v, RequestBlame)}
    assert blames  # every request ended, each with its blame
    for request_id, blame in blames.items():
        expected = run[f"expected {request_id}"]
        assert isinstance(expected, Expected)
        check_sums(blame, expected)
        check_culprits(blame, expected)
