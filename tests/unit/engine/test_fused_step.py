"""One forward pass per step (engine/fused.py): decodes and prefill chunks together give the
same greedy tokens as the two passes did, under every policy and weight format; the ragged
forward's logits match the two passes'; steps that both decode and prefill really are fused."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from engine import Engine, SamplingParams, StepStats  # noqa: E402
from engine.chunked import prefill_chunks  # noqa: E402
from engine.fused import fused_forward  # noqa: E402
from engine.runner import decode  # noqa: E402
from tests.helpers.checkpoints import checkpoint_fixture, make_engine  # noqa: E402

# Lengths around the 24-token budget, different output lengths: while the long prompts are
# still chunked, the short ones already decode beside them, and arrivals keep coming.
PROMPTS = ["hi", "short prompt " * 2, "a longer prompt that spans chunks " * 4, "xyz " * 40]
MAX_TOKENS = [14, 6, 10, 8]

checkpoint = checkpoint_fixture(seed=11)


class Steps:
    def __init__(self) -> None:
        self.stats: list[StepStats] = []

    def on_step(self, stats: StepStats) -> None:
        self.stats.append(stats)


def greedy_outputs(engine: Engine) -> list[list[int]]:
    async def staggered() -> list[list[int]]:
        async def one(index: int) -> list[int]:
            await asyncio.sleep(0.003 * index)  # later arrivals join a running batch
            params = SamplingParams(max_tokens=MAX_TOKENS[index], temperature=0, ignore_eos=True)
            return list((await engine.complete(PROMPTS[index], params)).token_ids)

        return list(await asyncio.gather(*(one(i) for i in range(len(PROMPTS)))))

    return asyncio.run(staggered())


@pytest.mark.parametrize("quantization", [None, "int8", "int4"])
@pytest.mark.parametrize("scheduling", ["fifo", "priority", "slo"])
def test_fused_and_two_pass_greedy_outputs_are_equal(
    checkpoint: Path, scheduling: str, quantization: str | None
) -> None:
    options: dict[str, Any] = {
        "max_num_batched_tokens": 24,
        "scheduling": scheduling,
        "quantization": quantization,
    }
    two_pass = make_engine(checkpoint, fuse_steps=False, **options)
    fused = make_engine(checkpoint, **options)
    steps = Steps()
    fused.add_hooks(steps)
    try:
        expected = greedy_outputs(two_pass)
        assert greedy_outputs(fused) == expected
    finally:
        two_pass.stop_sync()
        fused.stop_sync()
    assert [len(ids) for ids in expected] == MAX_TOKENS
    # Some steps both decoded and prefilled: those are the fused ones being compared.
    assert any(s.prefill_tokens and s.decode_tokens for s in steps.stats)


def test_ragged_logits_match_the_two_passes(checkpoint: Path) -> None:
    """Below the engine: the same cache state, one fused forward against prefill then decode."""
    engine = make_engine(checkpoint, max_num_batched_tokens=4096)
    try:
        worker = engine.worker
        model, cache = worker.model, worker.cache
        prompts = [engine.tokenizer.encode(p) for p in ("one two three " * 3, "abc " * 20)]
        sequences = [_sequence(worker, f"s{i}", ids) for i, ids in enumerate(prompts)]
        decodes, prefill = sequences[:1], sequences[1]
        prefill_chunks(model, cache, decodes, [decodes[0].num_tokens])
        decodes[0].output_ids.append(7)
        chunk = prefill.num_tokens - 5  # a chunk that does not end the prompt, then one that does
        prefill_chunks(model, cache, [prefill], [chunk])
        state = [(s.num_cached, list(s.output_ids)) for s in sequences]
        expected_decode = decode(model, cache, decodes)
        expected_chunk = prefill_chunks(model, cache, [prefill], [5])
        for sequence, (cached, _) in zip(sequences, state, strict=True):
            sequence.num_cached = cached  # as before the two passes: computed again, fused
        fused_decode, fused_chunk = fused_forward([(prefill, 5)])(model, cache, [*decodes, prefill])
        torch.testing.assert_close(fused_decode, expected_decode, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(fused_chunk, expected_chunk, rtol=1e-4, atol=1e-4)
        assert prefill.num_cached == prefill.num_tokens and decodes[0].num_cached == 1 + len(
            prompts[0]
        )
    finally:
        engine.stop_sync()


@pytest.mark.parametrize("window", [None, 6])
def test_a_mid_prompt_chunk_leaves_the_decodes_logits_as_decode_gives_them(
    checkpoint: Path, window: int | None
) -> None:
    """Several decodes of different lengths and two chunks, none ending its prompt (so only
    the decodes' rows reach the LM head), with and without a sliding window shorter than
    every context: the decodes' logits are the decode pass's, and the chunks' keys land in the
    cache as their own pass writes them."""
    engine = make_engine(checkpoint, max_num_batched_tokens=4096)
    if window is not None:
        engine.model.config = dataclasses.replace(engine.model.config, sliding_window=window)
    try:
        worker = engine.worker
        model, cache = worker.model, worker.cache
        decodes = [_sequence(worker, f"d{i}", list(range(1, 9 + 5 * i))) for i in range(3)]
        prefill_chunks(model, cache, decodes, [s.num_tokens for s in decodes])
        for sequence in decodes:
            sequence.output_ids.append(3)
        chunked = [_sequence(worker, f"c{i}", list(range(40 + i, 70))) for i in range(2)]
        prefill_chunks(model, cache, chunked, [9, 17])
        cached = [s.num_cached for s in [*decodes, *chunked]]
        expected = decode(model, cache, decodes)
        prefill_chunks(model, cache, chunked, [6, 5])
        written = torch.cat(  # the slots of every token the step computes
            [cache.table_slots(s.block_table)[s.num_tokens - 1 : s.num_tokens] for s in decodes]
            + [
                cache.table_slots(s.block_table)[n : n + c]
                for s, n, c in zip(chunked, [9, 17], [6, 5], strict=True)
            ]
        )
        keys = [layer[written].clone() for layer in cache.keys]
        for sequence, count in zip([*decodes, *chunked], cached, strict=True):
            sequence.num_cached = count
        for layer in cache.keys:  # the fused step must write them again
            layer[written] = 0
        fused_decode, fused_chunk = fused_forward([(chunked[0], 6), (chunked[1], 5)])(
            model, cache, [*decodes, *chunked]
        )
        torch.testing.assert_close(fused_decode, expected, rtol=1e-4, atol=1e-4)
        assert fused_chunk.shape == (2, fused_decode.shape[1])
        for layer, before in zip(cache.keys, keys, strict=True):
            torch.testing.assert_close(layer[written], before, rtol=1e-5, atol=1e-5)
        assert [s.num_cached for s in chunked] == [15, 22]
    finally:
        engine.stop_sync()


def test_table_slots_are_the_general_batchs_context_slots() -> None:
    from engine.config import ModelConfig
    from engine.kv_cache import PagedKVCache
    from tests.helpers.checkpoints import HF_TINY

    config = ModelConfig.from_dict(dict(HF_TINY))
    cache = PagedKVCache(
        config, num_blocks=32, block_size=4, dtype=torch.float32, device=torch.device("cpu")
    )
    table = [7, 3, 19, 5]
    general, _ = cache.build_batch([table], [2], [14])
    slots = cache.table_slots(table)
    assert torch.equal(slots[:16], general.context_slots[0])
    assert cache.table_slots(list(table)) is slots  # kept while the table is the same
    table.append(11)
    assert int(cache.table_slots(table)[17]) == 11 * 4 + 1
    assert torch.equal(cache.positions(6), torch.arange(6))


def _sequence(worker: Any, name: str, prompt_ids: list[int]) -> Any:
    from engine.sequence import Sequence

    sequence = Sequence(
        request_id=name,
        prompt_ids=prompt_ids,
        params=SamplingParams(max_tokens=4, temperature=0),
        priority=0,
        arrival=0,
        detokenizer=None,  # type: ignore[arg-type]  # never detokenized here
        deliver=lambda _: None,
    )
    worker.cache.ensure_capacity(sequence.block_table, len(prompt_ids) + 2)
    return sequence
