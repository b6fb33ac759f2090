"""Prefix caching: chain-hashed full blocks, shared with reference counts, evicted LRU."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from engine import Engine, SamplingParams, StepStats  # noqa: E402
from engine.kv_cache import BlockAllocator, OutOfBlocks, chain_hashes  # noqa: E402
from tests.helpers.checkpoints import checkpoint_fixture, make_engine  # noqa: E402

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
SYSTEM = "You are a careful assistant. Answer briefly and cite the rule you used. " * 2
QUESTIONS = [f"Q{i}: what is {i} plus {i}?" for i in range(6)]


checkpoint = checkpoint_fixture(seed=3)


@pytest.fixture
def cached(checkpoint: Path) -> Iterator[Engine]:
    engine = make_engine(checkpoint, enable_prefix_caching=True)
    yield engine
    engine.stop_sync()


class StepRecorder:
    def __init__(self) -> None:
        self.steps: list[StepStats] = []
        self.hits: list[tuple[str, int]] = []

    def on_step(self, stats: StepStats) -> None:
        self.steps.append(stats)

    def on_prefix_hit(self, request_id: str, time_ns: int, cached_tokens: int) -> None:
        self.hits.append((request_id, cached_tokens))


def complete_all(engine: Engine, prompts: list[str], together: bool = False) -> list[Any]:
    async def scenario() -> list[Any]:
        if together:
            return list(await asyncio.gather(*(engine.complete(p, GREEDY) for p in prompts)))
        return [await engine.complete(p, GREEDY) for p in prompts]

    return asyncio.run(scenario())


# ------------------------------------------------------------------------- the allocator
def test_chain_hash_depends_on_the_whole_prefix() -> None:
    a = chain_hashes([1, 2, 3, 4, 5, 6], block_size=2, num_blocks=3)
    b = chain_hashes([9, 9, 3, 4, 5, 6], block_size=2, num_blocks=3)
    assert a[1:] != b[1:]  # same tokens in blocks 1 and 2, different parents
    assert chain_hashes([1, 2, 3, 4, 5, 6], 2, 3, parents=a[:1]) == a


def test_allocator_shares_releases_and_evicts_lru() -> None:
    allocator = BlockAllocator(4, enable_caching=True)
    first, second = allocator.allocate(), allocator.allocate()
    allocator.register(first, 11)
    allocator.register(second, 22)
    allocator.acquire(allocator.lookup([11, 22, 33]))  # a second sequence shares both
    assert allocator.ref_count(first) == 2 and allocator.num_free == 2
    allocator.free([first, second])
    allocator.free([first, second])
    allocator.check()
    assert allocator.num_free == 4 and allocator.num_cached == 2  # cached, yet available
    # The tail of a chain goes before its head; free blocks go before any cached one.
    taken = [allocator.allocate() for _ in range(3)]
    assert second in taken and first not in taken
    assert allocator.lookup([11, 22]) == [first] and allocator.num_evictions == 1
    allocator.check()
    with pytest.raises(RuntimeError, match="freed twice"):
        allocator.free([first])
    allocator.allocate()
    with pytest.raises(OutOfBlocks):
        allocator.allocate()


def test_allocator_without_caching_never_registers() -> None:
    allocator = BlockAllocator(2)
    block = allocator.allocate()
    allocator.register(block, 5)
    allocator.free([block])
    assert allocator.lookup([5]) == [] and allocator.num_cached == 0
    allocator.check()


# ---------------------------------------------------------------------------- the engine
def test_shared_system_prompt_skips_prefill_and_keeps_output(
    checkpoint: Path, cached: Engine
) -> None:
    prompts = [SYSTEM + q for q in QUESTIONS]
    plain = make_engine(checkpoint)
    try:
        expected = [o.token_ids for o in complete_all(plain, prompts)]
        plain_prefill = plain.totals.prefill_tokens
    finally:
        plain.stop_sync()

    recorder = StepRecorder()
    cached.add_hooks(recorder)
    got = [o.token_ids for o in complete_all(cached, prompts)]
    assert got == expected

    system_blocks = len(cached.encode_prompt(SYSTEM)) // 8
    # Every request after the first finds at least the system prompt's full blocks.
    assert len(recorder.hits) == len(prompts) - 1
    assert all(tokens >= system_blocks * 8 for _, tokens in recorder.hits)
    queried = sum(s.prefix_cache_queried_tokens for s in recorder.steps)
    hit = sum(s.prefix_cache_hit_tokens for s in recorder.steps)
    prefilled = sum(s.prefill_tokens for s in recorder.steps)
    assert queried == sum(len(cached.encode_prompt(p)) for p in prompts)
    assert hit == sum(tokens for _, tokens in recorder.hits)
    assert prefilled == plain_prefill - hit == cached.totals.prefill_tokens
    assert cached.num_free_blocks == cached.num_blocks
    cached.worker.cache.allocator.check()


def test_concurrent_requests_share_blocks_and_match_plain(checkpoint: Path, cached: Engine) -> None:
    prompts = [SYSTEM + q for q in QUESTIONS]
    complete_all(cached, prompts[:1])  # warm the cache with the system prompt
    plain = make_engine(checkpoint)
    try:
        expected = [o.token_ids for o in complete_all(plain, prompts, together=True)]
    finally:
        plain.stop_sync()
    got = [o.token_ids for o in complete_all(cached, prompts, together=True)]
    assert got == expected
    assert cached.num_free_blocks == cached.num_blocks
    cached.worker.cache.allocator.check()


def test_cached_blocks_are_evicted_under_pressure(checkpoint: Path) -> None:
    # 24 blocks of 8 tokens: a handful of distinct prompts fill the cache with their blocks,
    # and later requests must evict them to run at all.
    engine = make_engine(checkpoint, enable_prefix_caching=True, num_kv_blocks=24)
    try:
        prompts = [f"distinct prompt number {i}: " + "abcdefgh" * 8 for i in range(10)]
        outs = complete_all(engine, prompts)
        assert all(len(o.token_ids) == GREEDY.max_tokens for o in outs)
        allocator = engine.worker.cache.allocator
        assert allocator.num_evictions > 0
        assert 0 < allocator.num_cached <= engine.num_blocks
        allocator.check()
        assert engine.num_free_blocks == engine.num_blocks  # free or cached-evictable
        # Concurrent load under pressure (preemption and eviction together) still balances.
        complete_all(engine, prompts + [SYSTEM + q for q in QUESTIONS], together=True)
        allocator.check()
        assert engine.num_free_blocks == engine.num_blocks
    finally:
        engine.stop_sync()


def test_a_full_prompt_hit_still_computes_the_last_token(cached: Engine) -> None:
    prompt = "x" * 31  # with <s>: 32 tokens, exactly four full blocks of 8
    first, second = complete_all(cached, [prompt, prompt])
    assert first.token_ids == second.token_ids
    # Three blocks come from the cache; the fourth holds the last token, which is recomputed.
    assert cached.totals.prefix_cache_hit_tokens == 24
