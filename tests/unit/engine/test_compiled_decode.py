"""`EngineConfig(compile=True)`: the compiled decode forward gives the eager engine's tokens,
is built during warm-up, and serves every later batch size and context length without
compiling again (a compile in the middle of serving would be a latency spike of seconds)."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import types
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from engine.compiled import CompiledForward  # noqa: E402
from tests.conftest import require_or_skip  # noqa: E402

pytestmark = pytest.mark.slow

PROMPTS = [
    "In the beginning",
    "And the LORD said unto Moses, Speak unto the children of Israel",
    "Blessed are",
    "The quick brown fox jumps over the lazy dog. " * 3,
]
GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


def start(compile: bool) -> Engine:
    config = EngineConfig(device="cpu", dtype="float32", compile=compile, num_kv_blocks=96)
    engine = Engine.from_pretrained("bundled:small", config)
    engine.start_sync()
    return engine


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[Engine, Engine]]:
    if shutil.which("g++") is None and shutil.which("c++") is None:
        require_or_skip("torch.compile on a CPU needs a C++ compiler (apt-get install g++)")
    eager, compiled = start(False), start(True)
    yield eager, compiled
    eager.stop_sync()
    compiled.stop_sync()


async def run_together(engine: Engine) -> list[tuple[int, ...]]:
    outs = await asyncio.gather(*(engine.complete(p, GREEDY) for p in PROMPTS))
    return [out.token_ids for out in outs]


def test_warm_up_builds_the_compiled_forward(engines: tuple[Engine, Engine]) -> None:
    eager, compiled = engines
    assert eager.model.compiled_forward is None
    assert compiled.model.compiled_forward is not None
    cold = compiled.cold_start
    assert cold is not None and cold.warmup_s > 0


def test_a_single_sequence_steps_without_dynamo_guards(engines: tuple[Engine, Engine]) -> None:
    _, compiled = engines
    forward = compiled.model.compiled_forward
    assert isinstance(forward, CompiledForward)
    # The batch-1 graph's bytecode, called directly.
    assert isinstance(forward.single, types.MethodType)
    original = type(compiled.model).decode_logits.__code__
    assert forward.single.__func__.__code__ is not original
    # Dynamo's entries live on this forward's own copy of the code, not on the class's.
    assert torch._dynamo.eval_frame._debug_get_cache_entry_list(original) == []


def test_the_unguarded_graph_serves_only_calls_it_was_built_for(
    engines: tuple[Engine, Engine],
) -> None:
    _, compiled = engines
    forward = compiled.model.compiled_forward
    assert isinstance(forward, CompiledForward)
    cache = compiled.worker.cache
    ids = torch.zeros((1, 1), dtype=torch.long)
    longest = compiled.worker.max_model_len
    with torch.inference_mode():
        one, positions = cache.build_batch([[0, 1]], [5], [1])
        assert forward._single_fits(ids, positions, one)
        beyond, positions_beyond = cache.build_batch([list(range(longest))], [longest], [1])
        assert not forward._single_fits(ids, positions_beyond, beyond)  # past the RoPE table
        two, positions_two = cache.build_batch([[0], [1]], [5, 3], [1, 1])
        assert not forward._single_fits(torch.zeros((2, 1), dtype=torch.long), positions_two, two)
    with torch.no_grad():  # built under inference mode: another grad mode takes the guards
        assert not forward._single_fits(ids, positions, one)
    # Built for this engine's cache: another engine's (sharing the model) is checked against it.
    assert forward._cache_shape == cache.keys[0].shape


def test_compiled_tokens_equal_eager_alone_and_batched_without_recompiling(
    engines: tuple[Engine, Engine],
) -> None:
    eager, compiled = engines
    dynamo_config = torch._dynamo.config
    previous = dynamo_config.error_on_recompile
    dynamo_config.error_on_recompile = True  # any new graph after warm-up fails the request
    try:
        for prompt in PROMPTS:  # batch 1, contexts from 3 to ~180 tokens
            alone = asyncio.run(compiled.complete(prompt, GREEDY)).token_ids
            assert alone == asyncio.run(eager.complete(prompt, GREEDY)).token_ids
        # Batches of 4 shrinking to 1 as the shorter requests finish.
        assert asyncio.run(run_together(compiled)) == asyncio.run(run_together(eager))
    finally:
        dynamo_config.error_on_recompile = previous


def test_compiled_decode_logits_match_eager(engines: tuple[Engine, Engine]) -> None:
    eager, compiled = engines
    from engine import runner
    from engine.warmup import probe_sequence

    def decode_logits(engine: Engine) -> torch.Tensor:
        sequence = probe_sequence(engine.tokenizer, "probe", engine.encode_prompt(PROMPTS[1]))
        engine.worker.cache.ensure_capacity(sequence.block_table, sequence.num_tokens + 1)
        try:
            with torch.inference_mode():
                runner.prefill(engine.model, engine.worker.cache, [sequence])
                sequence.output_ids.append(5)
                return runner.decode(engine.model, engine.worker.cache, [sequence])
        finally:
            engine.worker.cache.allocator.free(sequence.block_table)

    eager.stop_sync()  # the test drives the model directly: no worker may step meanwhile
    compiled.stop_sync()
    try:
        torch.testing.assert_close(
            decode_logits(compiled), decode_logits(eager), rtol=1e-4, atol=1e-4
        )
    finally:
        eager.start_sync()
        compiled.start_sync()


def test_new_weights_drop_the_compiled_forward(engines: tuple[Engine, Engine]) -> None:
    _, compiled = engines  # runs last in this module: it puts the engine back to eager
    compiled.model.fuse()  # what changing weights requires; frozen graphs would be stale
    assert compiled.model.compiled_forward is None
    out = asyncio.run(compiled.complete("Hi", SamplingParams(max_tokens=3, temperature=0)))
    assert len(out.token_ids) == 3  # eager again, still serving


def test_a_sliding_window_model_keeps_eager_tokens_past_its_window() -> None:
    """Past the window the forward masks the oldest keys, a branch the single-sequence graph
    (built at a short context) lacks: those steps must take the guarded path."""
    if shutil.which("g++") is None and shutil.which("c++") is None:
        require_or_skip("torch.compile on a CPU needs a C++ compiler (apt-get install g++)")

    def start_windowed(compile: bool) -> Engine:
        config = EngineConfig(
            device="cpu", dtype="float32", compile=compile, num_kv_blocks=32, max_model_len=64
        )
        engine = Engine.from_pretrained("bundled:tiny", config)
        engine.model.config = dataclasses.replace(engine.model.config, sliding_window=12)
        engine.start_sync()
        return engine

    eager, compiled = start_windowed(False), start_windowed(True)
    try:
        params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
        prompt = "The quick brown fox"  # 19 bytes: every decode step is past the window
        forward = compiled.model.compiled_forward
        assert isinstance(forward, CompiledForward) and forward.single is not None
        assert forward._max_context == 12
        expected = asyncio.run(eager.complete(prompt, params)).token_ids
        assert asyncio.run(compiled.complete(prompt, params)).token_ids == expected
    finally:
        eager.stop_sync()
        compiled.stop_sync()
