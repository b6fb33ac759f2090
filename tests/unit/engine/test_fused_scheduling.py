"""The slo policy with fused steps (engine/fused.py): a lower tier's prefill rides along a
TPOT-bound tier's decodes under the chunk cap instead of waiting, and the step-time model
learns what a fused step costs (its decodes and its prefill tokens apart)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

from engine.kv_cache import BlockAllocator
from engine.policies import PrefillTimeModel, TierObjective, create_policy
from engine.policies.slo import COLD_START_CHUNK_TOKENS, TPOT_TIER_RECENT_S
from engine.scheduler import Scheduler
from tests.helpers.scheduler_steps import BLOCK, SECOND, make_sequence, run_plan

OBJECTIVES = {0: TierObjective(ttft_s=1.0, tpot_s=0.01)}


def fused_scheduler(fused: bool) -> Scheduler:
    policy = create_policy("slo", objectives=OBJECTIVES, fused_steps=fused)
    return Scheduler(BlockAllocator(4096), BLOCK, 8, 512, policy=policy)


@pytest.mark.parametrize("fused", [True, False])
def test_a_lower_tiers_prefill_rides_along_premium_decodes(fused: bool) -> None:
    scheduler = fused_scheduler(fused)
    premium = make_sequence("premium", 0, 8, 0, 0, max_tokens=1000)
    scheduler.add(premium)
    run_plan(scheduler, scheduler.schedule(0))
    policy = scheduler.policy
    policy.after_step(0.02, 0.01, [premium], 512, 0)  # a step 4x its share: caps cut
    batch = make_sequence("batch", 2, 400, 1, 0, max_tokens=10)
    scheduler.add(batch)
    plan = scheduler.schedule(SECOND // 100)
    assert premium in plan.decodes
    chunks = dict((s.request_id, n) for s, n in plan.chunks)
    if fused:  # in the same step, within the cut chunk cap
        assert 0 < chunks["batch"] <= policy.chunk_cap < 512
    else:  # two passes: the batch prompt waits (at most 250 ms)
        assert "batch" not in chunks


def test_the_step_time_model_learns_decodes_and_prefill_tokens_apart() -> None:
    model = PrefillTimeModel()
    rng = random.Random(5)
    for _ in range(64):  # fused steps: 3 ms + 0.2 ms per decode + 10 us per prefill token
        tokens, decodes = rng.choice([0, 16, 64, 256]), rng.randint(0, 16)
        model.observe(tokens, 0.003 + 0.0002 * decodes + 0.00001 * tokens, decodes)
    assert model.base_s == pytest.approx(0.003, rel=1e-6)
    assert model.per_decode_s == pytest.approx(0.0002, rel=1e-6)
    assert model.per_token_s == pytest.approx(0.00001, rel=1e-6)
    # 900 tokens at 256 a step beside 16 decodes: 4 steps of (3 + 3.2) ms + 9 ms.
    assert model.predict_s(900, 256, decodes=16) == pytest.approx(4 * 0.0062 + 0.009)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0, 16, 64, 900, 4096]),
            st.integers(0, 64),
            st.floats(1e-4, 0.2, allow_nan=False),
        ),
        min_size=1,
        max_size=300,
    )
)
def test_the_step_time_model_fits_its_window_as_least_squares(
    steps: list[tuple[int, int, float]],
) -> None:
    """The model keeps running sums (a step's fit costs the same whatever the window); after
    every step its fit is the least-squares fit of the last 64 steps, as numpy's solver
    gives it where both regressors vary."""
    model = PrefillTimeModel(window=64)
    for index, (tokens, decodes, step_s) in enumerate(steps):
        model.observe(tokens, step_s, decodes)
        window = steps[max(0, index - 63) : index + 1]
        x = np.array([[1.0, t, d] for t, d, _ in window])
        y = np.array([s for _, _, s in window])
        if np.linalg.matrix_rank(x) < 3:
            continue  # a regressor did not vary: the model folds it, numpy cannot tell
        base, per_token, per_decode = np.linalg.lstsq(x, y, rcond=None)[0]
        if per_token < 1e-12 or per_decode < 1e-12:
            # the model drops to one regressor (tested above and below); a slope within
            # rounding of zero (numpy's 4e-19) may land on either side of it in the sums
            continue
        assert model.per_token_s == pytest.approx(per_token, rel=1e-6, abs=1e-12)
        assert model.per_decode_s == pytest.approx(per_decode, rel=1e-6, abs=1e-12)
        assert model.base_s == pytest.approx(max(0.0, base), rel=1e-6, abs=1e-9)


def test_the_step_time_model_folds_constant_decodes_into_the_base() -> None:
    model = PrefillTimeModel()
    for tokens in (0, 50, 100, 0, 100, 50, 100, 0):  # always 4 decodes
        model.observe(tokens, 0.005 + 0.0001 * tokens, 4)
    assert model.per_decode_s == 0.0
    assert model.base_s == pytest.approx(0.005) and model.per_token_s == pytest.approx(0.0001)


def test_a_fresh_server_caps_the_chunk_beside_its_first_premium_request() -> None:
    """Before the step-time model has seen a step, a premium request's first step shares at
    most COLD_START_CHUNK_TOKENS with a lower tier's prompt, not the whole budget: its TTFT
    is that step."""
    policy = create_policy("slo", objectives=OBJECTIVES, fused_steps=True)
    scheduler = Scheduler(BlockAllocator(4096), BLOCK, 8, 4096, policy=policy)
    scheduler.add(make_sequence("batch", 2, 3000, 0, 0, max_tokens=10))
    premium = make_sequence("premium", 0, 40, 1, 0, max_tokens=10)
    scheduler.add(premium)
    plan = scheduler.schedule(0)
    assert not scheduler.policy.prefill_time.ready
    chunks = {sequence.request_id: tokens for sequence, tokens in plan.chunks}
    assert chunks["premium"] == 40  # its whole prompt, first
    assert plan.prefill_tokens == COLD_START_CHUNK_TOKENS < 3000
    run_plan(scheduler, plan)
    # The cap it learns from starts there too, not at the budget.
    scheduler.policy.after_step(0.004, 0.01, [premium], 4096, 0, prefill_tokens=256)
    assert scheduler.policy.chunk_cap is not None
    assert scheduler.policy.chunk_cap <= COLD_START_CHUNK_TOKENS * 1.25


def test_a_flood_before_the_first_premium_request_runs_capped_steps() -> None:
    """A fresh server expects its TPOT-bound tier: a lower tier's flood that comes first is
    prefilled COLD_START_CHUNK_TOKENS a step, not the whole budget (a 4096-token step is 150
    ms on bundled:tiny, and premium's first request would wait for it); once the tier has not
    been seen for TPOT_TIER_RECENT_S, the steps take the whole budget again."""
    policy = create_policy("slo", objectives=OBJECTIVES, fused_steps=True)
    scheduler = Scheduler(BlockAllocator(4096), BLOCK, 8, 4096, policy=policy)
    for index in range(3):
        scheduler.add(make_sequence(f"batch-{index}", 2, 3000, index, 0, max_tokens=10))
    plan = scheduler.schedule(SECOND)
    assert plan.prefill_tokens == COLD_START_CHUNK_TOKENS
    run_plan(scheduler, plan)
    later = int((1 + TPOT_TIER_RECENT_S + 1) * SECOND)
    assert scheduler.schedule(later).prefill_tokens == 4096


def test_a_cap_starts_where_the_step_time_model_says_a_step_fits() -> None:
    scheduler = fused_scheduler(True)
    model = scheduler.policy.prefill_time
    for tokens in (0, 50, 100, 0, 100, 50, 100, 0):  # 1 ms + 20 us per prefill token
        model.observe(tokens, 0.001 + 0.00002 * tokens)
    premium = make_sequence("premium", 0, 8, 0, 0, max_tokens=1000)
    scheduler.add(premium)
    run_plan(scheduler, scheduler.schedule(0))
    scheduler.add(make_sequence("batch", 2, 2000, 1, 0, max_tokens=10))
    plan = scheduler.schedule(SECOND // 100)
    # 10 ms TPOT at 50%: 5 ms a step, 1 ms of it fixed: 200 prefill tokens, not the 512 budget.
    assert premium in plan.decodes
    assert plan.prefill_tokens == 200 == scheduler.policy.fitted_chunk(0.01)
