"""Tier isolation in the scheduler: preemption by priority, aging, and SLO shedding.

The scheduler is driven step by step with an injected clock and no model: a planned chunk or
decode is "computed" by moving the sequence's counters, so every decision is exact.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from engine.kv_cache import BlockAllocator
from engine.policies import SHED_TTFT_OUT_OF_REACH, TierObjective
from engine.policies import create_policy as Policy
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from tests.helpers.scheduler_steps import BLOCK, SECOND, make_sequence, run_plan


def make_scheduler(
    policy: str,
    *,
    max_batch_size: int = 8,
    num_blocks: int = 64,
    budget: int = 64,
    aging_s: float | None = 2.0,
    objectives: dict[int, TierObjective] | None = None,
) -> Scheduler:
    return Scheduler(
        BlockAllocator(num_blocks),
        BLOCK,
        max_batch_size,
        budget,
        policy=Policy(policy, aging_s=aging_s, objectives=objectives),
    )


# ------------------------------------------------------------------------ chunked budget
def test_decodes_go_first_and_prefill_chunks_fill_the_budget() -> None:
    scheduler = make_scheduler("priority", budget=16)
    decoding = make_sequence("decoding", 0, 4, 0, 0, max_tokens=100)
    scheduler.add(decoding)
    run_plan(scheduler, scheduler.schedule(0))
    assert decoding.prefilled
    long = make_sequence("long", 2, 40, 1, 0)
    scheduler.add(long)
    chunks = []
    for step in range(1, 10):
        plan = scheduler.schedule(step)
        assert plan.decodes == [decoding]  # never stalled behind the long prompt
        assert plan.prefill_tokens + len(plan.decodes) <= 16
        chunks += [count for sequence, count in plan.chunks if sequence is long]
        run_plan(scheduler, plan)
        if long.prefilled:
            break
    assert chunks == [15, 15, 10]  # 40 tokens over three steps, one token a step for the decode


# ----------------------------------------------------------------------------- preemption
@pytest.mark.parametrize("policy", ["priority", "slo"])
def test_a_waiting_higher_tier_preempts_the_lowest_running_one(policy: str) -> None:
    scheduler = make_scheduler(policy, max_batch_size=2)
    standard = make_sequence("standard", 1, 4, 0, 0, max_tokens=100)
    batch = make_sequence("batch", 2, 4, 1, 0, max_tokens=100)
    scheduler.add(standard)
    scheduler.add(batch)
    run_plan(scheduler, scheduler.schedule(0))
    assert scheduler.running == [standard, batch]

    premium = make_sequence("premium", 0, 4, 2, 1)
    scheduler.add(premium)
    plan = scheduler.schedule(1)
    assert plan.preempted == [batch]  # the lowest tier, not the standard one
    assert premium in plan.admitted and batch.num_preemptions == 1
    assert batch not in plan.decodes and batch.block_table == []

    # A request of the same tier as every running one preempts nobody.
    run_plan(scheduler, plan)
    other = make_sequence("standard-2", 1, 4, 3, 2)
    scheduler.add(other)
    plan = scheduler.schedule(2)
    assert plan.preempted == [] and other not in plan.admitted


def test_fifo_never_preempts_for_a_waiting_request() -> None:
    scheduler = make_scheduler("fifo", max_batch_size=1)
    batch = make_sequence("batch", 2, 4, 0, 0, max_tokens=100)
    scheduler.add(batch)
    run_plan(scheduler, scheduler.schedule(0))
    premium = make_sequence("premium", 0, 4, 1, 0)
    scheduler.add(premium)
    plan = scheduler.schedule(1)
    assert plan.preempted == [] and plan.decodes == [batch] and plan.admitted == []


def test_out_of_blocks_preempts_in_priority_order() -> None:
    # 6 blocks of 4 tokens: three 7-token prompts take 2 blocks each, then decodes need more.
    scheduler = make_scheduler("priority", num_blocks=6)
    sequences = [make_sequence(f"p{p}", p, 7, p, 0, max_tokens=100) for p in (2, 0, 1)]
    for sequence in sequences:
        scheduler.add(sequence)
    run_plan(scheduler, scheduler.schedule(0))
    preempted: list[str] = []
    for step in range(1, 12):  # p0 reaches 19 tokens: it fits alone, never preempted
        plan = scheduler.schedule(step)
        preempted += [s.request_id for s in plan.preempted]
        run_plan(scheduler, plan)
    assert preempted[:2] == ["p2", "p1"]  # lowest tier first, the top tier never
    assert "p0" not in preempted


# ---------------------------------------------------------------------------------- aging
def starved_steps(aging_s: float | None, steps: int = 60) -> int | None:
    """One batch slot, a premium request arriving every step (0.1 s): the step at which the
    batch request got its slot, or None if it never did."""
    scheduler = make_scheduler("priority", max_batch_size=1, aging_s=aging_s)
    batch = make_sequence("batch", 2, 4, 0, 0, max_tokens=1)
    scheduler.add(batch)
    scheduler.add(make_sequence("premium-0", 0, 4, 1, 0, max_tokens=1))
    for step in range(steps):
        now = step * SECOND // 10
        plan = scheduler.schedule(now)
        if batch in plan.admitted:
            return step
        run_plan(scheduler, plan)
        scheduler.add(make_sequence(f"premium-{step + 1}", 0, 4, step + 2, now, max_tokens=1))
    return None


def test_aging_bounds_how_long_the_lowest_tier_waits() -> None:
    assert starved_steps(aging_s=None) is None  # without aging the flood starves it
    admitted_at = starved_steps(aging_s=1.0)
    assert admitted_at is not None
    # Two levels up at one level per second: admitted once it has waited 2 s (20 steps).
    assert 20 <= admitted_at <= 22


# -------------------------------------------------------------------------------- shedding
OBJECTIVES = {0: TierObjective(ttft_s=0.1), 1: TierObjective(ttft_s=0.5), 2: TierObjective()}


def trained_slo_scheduler(budget: int = 100) -> Scheduler:
    scheduler = make_scheduler("slo", budget=budget, num_blocks=4096, objectives=OBJECTIVES)
    model = scheduler.policy.prefill_time
    for tokens in (0, 50, 100, 0, 100, 50, 100, 0):  # step = 5 ms + 0.1 ms per prefill token
        model.observe(tokens, 0.005 + 0.0001 * tokens)
    assert model.ready
    return scheduler


def predicted_first_token_ns(
    scheduler: Scheduler, order: list[Sequence], now_ns: int
) -> dict[str, float]:
    """Independent of the scheduler's loop: prefill of everything ahead and itself."""
    model, ahead, out = scheduler.policy.prefill_time, 0, {}
    for sequence in order:
        ahead += sequence.num_tokens
        out[sequence.request_id] = now_ns + model.predict_s(ahead, 100) * 1e9
    return out


def test_nothing_is_shed_while_every_objective_is_in_reach() -> None:
    scheduler = trained_slo_scheduler()
    for index in range(4):
        scheduler.add(make_sequence(f"premium-{index}", 0, 50, index, 0))
    plan = scheduler.schedule(0)
    assert plan.shed == []
    assert len(plan.admitted) == 2  # 100 tokens of budget: two now, two next step


def test_shed_only_what_is_out_of_reach_lowest_tier_first() -> None:
    scheduler = trained_slo_scheduler()
    queue: list[Sequence] = []
    for index in range(10):  # standard requests, 100 tokens each: 15 ms of prefill apiece
        queue.append(make_sequence(f"standard-{index}", 1, 100, index, 0))
    for index in range(3):  # premium, arriving later but with a tighter objective
        queue.append(make_sequence(f"premium-{index}", 0, 20, 10 + index, 0))
    for sequence in queue:
        scheduler.add(sequence)
    now = SECOND // 100 * 37  # 370 ms after they all arrived
    plan = scheduler.schedule(now)
    shed = {s.request_id: reason for s, reason in plan.shed}
    assert set(shed.values()) == {SHED_TTFT_OUT_OF_REACH}
    # Premium's 100 ms deadline passed: out of reach whatever the order.
    assert {f"premium-{i}" for i in range(3)} <= set(shed)
    kept = [s for s in scheduler.all_sequences() if s.request_id not in shed]
    kept.sort(key=lambda s: scheduler.policy.rank(s, now, 100))
    predicted = predicted_first_token_ns(scheduler, kept, now)
    for sequence in kept:  # every request kept can still make its 500 ms
        assert predicted[sequence.request_id] <= scheduler.policy.ttft_deadline_ns(sequence)
    # Standard ones are shed only from the back of the queue, where 500 ms is out of reach:
    # 8 x 100 tokens fit in 130 ms (8 steps of 5 ms + 80 ms), a ninth does not.
    standard_shed = sorted(int(name.split("-")[1]) for name in shed if name.startswith("standard"))
    assert standard_shed == [8, 9]
    first_shed = next(s for s in queue if s.request_id == "standard-8")
    missed = predicted_first_token_ns(scheduler, [*kept, first_shed], now)["standard-8"]
    assert missed > scheduler.policy.ttft_deadline_ns(first_shed)


def test_premium_is_not_shed_for_a_lower_tier_ahead_of_it() -> None:
    # Six standard requests (100 tokens, 500 ms) waited 400 ms: 85 ms of slack each, so the
    # slack order puts them before a premium request (60 tokens) that just arrived with the
    # same deadline. All seven take 101 ms: one of them misses. A standard one goes, never
    # premium: premium alone (11 ms) is well within reach.
    scheduler = trained_slo_scheduler()
    now = SECOND // 10 * 4
    for index in range(6):
        scheduler.add(make_sequence(f"standard-{index}", 1, 100, index, 0))
    premium = make_sequence("premium", 0, 60, 6, now)  # arrives now: its deadline is 500 ms
    scheduler.add(premium)
    policy = scheduler.policy
    assert policy.ttft_deadline_ns(premium) == SECOND // 2
    assert policy.rank(premium, now, 100) > policy.rank(scheduler._waiting[0], now, 100)
    plan = scheduler.schedule(now)
    assert [(s.request_id, r) for s, r in plan.shed] == [("standard-5", SHED_TTFT_OUT_OF_REACH)]


def test_premium_is_shed_when_premium_alone_cannot_be_served() -> None:
    # Twenty premium requests of 50 tokens (100 ms each): 10 steps of 5 ms + 100 ms = 150 ms.
    # The first ones fit; those behind them in premium's own queue are out of reach, and
    # a standard request (500 ms) waiting beside them is kept.
    scheduler = trained_slo_scheduler()
    for index in range(20):
        scheduler.add(make_sequence(f"premium-{index}", 0, 50, index, 0))
    scheduler.add(make_sequence("standard", 1, 50, 12, 0))
    plan = scheduler.schedule(0)
    shed = [s.request_id for s, _ in plan.shed]
    assert shed and "standard" not in shed
    assert all(name.startswith("premium-") for name in shed)
    kept = 20 - len(shed)
    # Kept: k requests of 50 tokens fit in 100 ms (ceil(50k/100) steps of 5 ms + 5 ms per 50).
    model = scheduler.policy.prefill_time
    assert model.predict_s(50 * kept, 100) <= 0.1 < model.predict_s(50 * (kept + 1), 100)


def test_a_tier_without_a_ttft_objective_is_never_shed() -> None:
    scheduler = trained_slo_scheduler()
    for index in range(50):
        scheduler.add(make_sequence(f"batch-{index}", 2, 100, index, 0))
    plan = scheduler.schedule(100 * SECOND)
    assert plan.shed == []


def test_nothing_is_shed_before_the_prefill_time_is_learned() -> None:
    scheduler = make_scheduler("slo", objectives=OBJECTIVES)
    for index in range(20):
        scheduler.add(make_sequence(f"premium-{index}", 0, 8, index, 0))
    assert scheduler.schedule(10 * SECOND).shed == []


# ---------------------------------------------------------------- slo: decodes take turns
def test_lower_tiers_decode_in_turns_while_a_tpot_bound_tier_decodes() -> None:
    objectives = {0: TierObjective(ttft_s=1.0, tpot_s=0.01)}
    scheduler = make_scheduler("slo", budget=512, num_blocks=4096, objectives=objectives)
    batch = [make_sequence(f"batch-{i}", 2, 400, i, 0, max_tokens=1000) for i in range(6)]
    premium = make_sequence("premium", 0, 8, 6, 0, max_tokens=1000)
    for sequence in batch:
        scheduler.add(sequence)
    step = 0
    while not all(s.prefilled for s in batch):  # prefill the batch: 2400 tokens, capped
        assert step < 20, "the batch's prefill did not finish"  # (a fresh server's steps)
        run_plan(scheduler, scheduler.schedule(step))
        step += 1
    scheduler.add(premium)
    run_plan(scheduler, scheduler.schedule(step))
    assert all(s.prefilled for s in [*batch, premium])
    policy = scheduler.policy
    policy.after_step(1.0, 0.01, [premium, *batch], 512, 0)  # a slow step: the caps halve
    assert policy.decode_context_cap is not None and policy.decode_context_cap < 6 * 400
    turns: dict[str, int] = {}
    for turn in range(step + 1, step + 13):
        plan = scheduler.schedule(turn)
        assert premium in plan.decodes  # the TPOT-bound tier decodes every step
        assert plan.waiting_decodes == len(batch) + 1 - len(plan.decodes) > 0
        for sequence in plan.decodes:
            turns[sequence.request_id] = turns.get(sequence.request_id, 0) + 1
        run_plan(scheduler, plan)
    counts = [turns.get(s.request_id, 0) for s in batch]
    assert min(counts) >= 1 and max(counts) - min(counts) <= 1  # round robin, nobody stops


def test_fifo_and_priority_decode_everyone_every_step() -> None:
    for policy in ("fifo", "priority"):
        scheduler = make_scheduler(policy, objectives={0: TierObjective(tpot_s=0.01)})
        sequences = [make_sequence(f"s{i}", i % 3, 8, i, 0, max_tokens=100) for i in range(5)]
        for sequence in sequences:
            scheduler.add(sequence)
        run_plan(scheduler, scheduler.schedule(0))
        scheduler.policy.after_step(1.0, 0.01, sequences, 64, 0)
        assert {s.request_id for s in scheduler.schedule(1).decodes} == {
            s.request_id for s in sequences
        }


def test_lower_tiers_prefill_waits_while_a_tpot_bound_tier_decodes_but_not_for_ever() -> None:
    objectives = {0: TierObjective(ttft_s=1.0, tpot_s=0.01)}
    scheduler = make_scheduler("slo", budget=512, num_blocks=4096, objectives=objectives)
    premium = make_sequence("premium", 0, 8, 0, 0, max_tokens=1000)
    scheduler.add(premium)
    run_plan(scheduler, scheduler.schedule(0))  # premium prefilled, decoding from now on
    batch = make_sequence("batch", 2, 400, 1, 0, max_tokens=10)
    scheduler.add(batch)
    now = 0
    waited = []
    while not batch.prefill_started and now < 2 * SECOND:
        now += SECOND // 100  # a step every 10 ms
        plan = scheduler.schedule(now)
        assert premium in plan.decodes
        if not any(sequence is batch for sequence, _ in plan.chunks):
            waited.append(now)
        else:
            batch.prefill_started = True
        run_plan(scheduler, plan)
    # The batch prompt waited while premium decoded, and went in once it had waited its most.
    assert waited and batch.prefill_started
    wait_s = (now - waited[0] + SECOND // 100) / SECOND
    assert 0.2 <= wait_s <= 0.3, wait_s


def test_steps_stay_bounded_between_a_tpot_bound_tiers_requests_for_a_while() -> None:
    objectives = {0: TierObjective(ttft_s=1.0, tpot_s=0.01)}
    policy = Policy("slo", objectives=objectives)
    premium = make_sequence("premium", 0, 8, 0, 0)
    batch = make_sequence("batch", 2, 400, 1, 0)
    # A fresh server expects its TPOT-bound tiers: its first step is bounded as if between
    # their requests, and not for long without one.
    first = policy.step_tpot_s([batch], [], 0)
    assert first is not None and 0.01 < first <= 0.05
    assert policy.step_tpot_s([batch], [], 20 * SECOND) is None  # not seen since: no bound
    # Then premium comes: its own sighting bounds the steps after it, for a while.
    assert policy.step_tpot_s([premium, batch], [], 21 * SECOND) == 0.01  # decoding: its TPOT
    between = policy.step_tpot_s([batch], [], 22 * SECOND)  # gone, seen a second ago
    assert between is not None and 0.01 < between <= 0.05
    assert policy.step_tpot_s([batch], [], 50 * SECOND) is None  # not seen for long: no bound


def test_steps_between_requests_leave_room_for_the_ttft_of_the_next_one() -> None:
    """A request that arrives waits for the step in flight: between premium's requests a step
    targets at most a quarter of its TTFT objective (100 ms: 25 ms, a bound of 50 ms at the
    50% share), not 5 of its TPOT objectives (100 ms at 20 ms); and the bound holds while a
    looser TPOT-bound tier decodes."""
    objectives = {
        0: TierObjective(ttft_s=0.1, tpot_s=0.02),
        1: TierObjective(ttft_s=0.5, tpot_s=0.1),
    }
    policy = Policy("slo", objectives=objectives)
    premium = make_sequence("premium", 0, 8, 0, 0)
    standard = make_sequence("standard", 1, 8, 1, 0)
    batch = make_sequence("batch", 2, 400, 2, 0)
    assert policy.step_tpot_s([batch], [], 0) is not None  # a fresh server: bounded a while
    start = 60 * SECOND  # after that while, premium comes: its sighting is what bounds now
    assert policy.step_tpot_s([premium, batch], [], start) == 0.02  # decoding: its TPOT
    assert policy.step_tpot_s([batch], [], start + SECOND) == pytest.approx(0.05)  # between
    assert policy.step_tpot_s([standard, batch], [], start + SECOND) == pytest.approx(0.05)
    # Premium not seen for long: the standard tier's own TPOT objective bounds its steps.
    assert policy.step_tpot_s([standard, batch], [], start + 60 * SECOND) == pytest.approx(0.1)


def test_a_more_important_tier_never_waits_for_a_tpot_bound_one() -> None:
    # Tier 0 has only a TTFT objective; tier 1 has a TPOT objective and is decoding.
    objectives = {0: TierObjective(ttft_s=0.2), 1: TierObjective(ttft_s=1.0, tpot_s=0.05)}
    scheduler = make_scheduler("slo", budget=512, num_blocks=4096, objectives=objectives)
    standard = make_sequence("standard", 1, 8, 0, 0, max_tokens=1000)
    scheduler.add(standard)
    run_plan(scheduler, scheduler.schedule(0))
    urgent = make_sequence("urgent", 0, 100, 1, 0, max_tokens=10)
    below = make_sequence("below", 2, 100, 2, 0, max_tokens=10)
    scheduler.add(urgent)
    scheduler.add(below)
    plan = scheduler.schedule(SECOND // 100)
    chunked = {sequence.request_id for sequence, _ in plan.chunks}
    assert "urgent" in chunked  # above the decoding TPOT-bound tier: prefilled at once
    assert "below" not in chunked  # below it, without a TPOT objective: waits


def test_the_step_that_ends_the_wait_is_not_held_to_the_busy_chunk_cap() -> None:
    objectives = {0: TierObjective(ttft_s=1.0, tpot_s=0.01)}
    scheduler = make_scheduler("slo", budget=512, num_blocks=4096, objectives=objectives)
    premium = make_sequence("premium", 0, 8, 0, 0, max_tokens=100_000)
    scheduler.add(premium)
    run_plan(scheduler, scheduler.schedule(0))
    for _ in range(8):  # slow steps while premium decodes: the prefill cap falls to its floor
        scheduler.policy.after_step(1.0, 0.01, [premium], 512, 0)
    busy_cap = scheduler.policy.chunk_cap
    assert busy_cap is not None and busy_cap <= 32
    batch = make_sequence("batch", 2, 400, 1, 0, max_tokens=10)
    scheduler.add(batch)
    now = 0
    chunk = 0
    while not chunk and now < 2 * SECOND:
        now += SECOND // 100
        plan = scheduler.schedule(now)
        chunk = sum(count for sequence, count in plan.chunks if sequence is batch)
        run_plan(scheduler, plan)
    # Released after its wait, the long prompt gets more than one busy-sized chunk.
    assert chunk > busy_cap
