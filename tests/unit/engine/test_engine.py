"""Continuous batching, preemption, cancellation, priorities, sampling and hooks of the engine."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from engine import (  # noqa: E402
    Engine,
    EngineOverloaded,
    EngineStepFailed,
    RequestStream,
    RequestTooLarge,
    SamplingParams,
    StepStats,
)
from engine.hooks import HookDispatch  # noqa: E402
from tests.helpers.checkpoints import checkpoint_fixture, make_engine  # noqa: E402

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
PROMPTS = [f"request {i}: " + "lorem ipsum " * (i % 5) for i in range(12)]
checkpoint = checkpoint_fixture(seed=7)


@pytest.fixture
def engine(checkpoint: Path) -> Iterator[Engine]:
    engine = make_engine(checkpoint)
    yield engine
    engine.stop_sync()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_concurrent_greedy_equals_alone(engine: Engine) -> None:
    async def alone() -> list[tuple[int, ...]]:
        return [(await engine.complete(p, GREEDY)).token_ids for p in PROMPTS]

    async def together() -> list[tuple[int, ...]]:
        outs = await asyncio.gather(*(engine.complete(p, GREEDY) for p in PROMPTS))
        return [o.token_ids for o in outs]

    assert run(alone()) == run(together())
    assert engine.num_free_blocks == engine.num_blocks


def test_preemption_keeps_outputs_and_frees_blocks(checkpoint: Path) -> None:
    reference = make_engine(checkpoint)
    expected = [run(reference.complete(p, GREEDY)).token_ids for p in PROMPTS]
    reference.stop_sync()

    # 12 blocks of 8 tokens cannot hold 12 sequences of up to ~90 tokens: preemption must happen.
    small = make_engine(checkpoint, num_kv_blocks=12)
    preempted = []
    small.add_hooks(type("H", (), {"on_step": lambda self, s: preempted.append(s.num_preempted)})())

    async def together() -> list[tuple[int, ...]]:
        return [
            o.token_ids for o in await asyncio.gather(*(small.complete(p, GREEDY) for p in PROMPTS))
        ]

    assert run(together()) == expected
    assert sum(preempted) > 0
    assert small.num_free_blocks == small.num_blocks
    small.stop_sync()


def test_cancellation_frees_blocks_within_a_step(engine: Engine) -> None:
    async def scenario() -> None:
        params = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
        streams = [engine.generate(p, params) for p in PROMPTS[:6]]
        for stream in streams:
            await anext(stream)
        assert engine.num_free_blocks < engine.num_blocks
        for stream in streams:
            await stream.aclose()
        await engine.wait_idle(timeout_s=5)

    run(scenario())
    assert engine.num_free_blocks == engine.num_blocks
    assert engine.worker.scheduler.running == []


def test_priority_order_then_fifo(checkpoint: Path) -> None:
    engine = make_engine(checkpoint, max_batch_size=1)
    order: list[str] = []
    engine.add_hooks(type("H", (), {"on_schedule": lambda self, rid, t: order.append(rid)})())

    async def scenario() -> None:
        blocker = engine.submit(
            "blocker",
            SamplingParams(max_tokens=30, temperature=0, ignore_eos=True),
            request_id="blocker",
        )
        await anext(blocker)  # the blocker is running; everything below waits behind it
        params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
        streams = [
            engine.submit("x", params, priority=2, request_id="low-1"),
            engine.submit("x", params, priority=0, request_id="high-1"),
            engine.submit("x", params, priority=1, request_id="mid-1"),
            engine.submit("x", params, priority=0, request_id="high-2"),
        ]
        for stream in [blocker, *streams]:
            async for _ in stream:
                pass

    run(scenario())
    assert order == ["blocker", "high-1", "high-2", "mid-1", "low-1"]
    engine.stop_sync()


def test_overload_raises_at_once(checkpoint: Path) -> None:
    engine = make_engine(checkpoint, max_batch_size=1, max_waiting=2)

    async def scenario() -> None:
        params = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
        running = engine.submit("a", params)
        await anext(running)
        engine.submit("b", params)
        engine.submit("c", params)
        with pytest.raises(EngineOverloaded) as caught:
            engine.submit("d", params)
        assert caught.value.retry_after_s > 0
        assert "waiting" in str(caught.value)

    run(scenario())
    engine.stop_sync()


def test_too_large_requests_are_refused(engine: Engine) -> None:
    """Each refusal names the parameter to change (the API reports it as the error's param)."""
    context = engine.max_model_len

    async def scenario() -> None:
        with pytest.raises(RequestTooLarge, match="context") as caught:
            engine.submit("x" * (context - 50), SamplingParams(max_tokens=100))
        assert caught.value.param == "max_tokens"
        with pytest.raises(RequestTooLarge, match="context") as caught:
            engine.submit([1] * context, SamplingParams(max_tokens=1))
        assert caught.value.param == "prompt"
        with pytest.raises(RequestTooLarge, match="cap") as caught:
            engine.submit("x", SamplingParams(max_tokens=10_000))
        assert caught.value.param == "max_tokens"
        with pytest.raises(RequestTooLarge, match="empty") as caught:
            engine.submit([], SamplingParams(max_tokens=1))
        assert (caught.value.param, caught.value.code) == ("prompt", None)

    run(scenario())
    assert engine.num_active_requests == 0  # nothing refused was queued


def test_closing_a_stream_calls_its_abort_once() -> None:
    aborted: list[str] = []

    async def scenario() -> None:
        stream = RequestStream("req-1", 3, aborted.append)
        stream.cancel()
        stream.cancel()
        with pytest.raises(StopAsyncIteration):
            await anext(stream)

    run(scenario())
    assert aborted == ["req-1"]


def test_hook_dispatch_binds_only_the_methods_present() -> None:
    class Tokens:
        def __init__(self) -> None:
            self.seen: list[str] = []

        def on_token(self, request_id: str, time_ns: int, token_index: int) -> None:
            self.seen.append(request_id)

    dispatch, hooks = HookDispatch(), Tokens()
    dispatch.add(hooks)
    assert [len(dispatch.by_event[e]) for e in ("on_token", "on_finish")] == [1, 0]
    dispatch.by_event["on_token"][0]("r", 0, 0)
    dispatch.remove(hooks)
    assert dispatch.by_event["on_token"] == [] and hooks.seen == ["r"]


def test_seeded_sampling_is_repeatable_and_varies_with_seed(engine: Engine) -> None:
    def sample(seed: int) -> tuple[int, ...]:
        params = SamplingParams(
            max_tokens=20, temperature=1.0, top_p=0.9, top_k=50, seed=seed, ignore_eos=True
        )
        return run(engine.complete("seeded", params)).token_ids

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)


def test_stop_string_truncates_and_finishes(engine: Engine) -> None:
    free = run(
        engine.complete("stop test", SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    )
    stop = free.text[5:8]
    assert len(stop) == 3
    stopped = run(
        engine.complete(
            "stop test", SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, stop=(stop,))
        )
    )
    assert stopped.finish_reason == "stop"
    assert stopped.text == free.text[: free.text.index(stop)]
    assert stop not in stopped.text


def test_streamed_text_never_splits_a_character(engine: Engine) -> None:
    # Feed a multi-byte text back as "generated" tokens through the detokenizer.
    from engine.tokenizer import IncrementalDetokenizer

    text = "naïve café — 日本語 😀!"
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer.for_prompt(engine.tokenizer, [])
    pieces = [detok.step(ids[: i + 1]) for i in range(len(ids))]
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)


def test_hooks_see_every_phase_in_order(engine: Engine) -> None:
    events: list[tuple[str, str]] = []
    stamps: list[int] = []

    class Recorder:
        def __getattr__(self, name: str) -> Any:
            if not name.startswith("on_"):
                raise AttributeError(name)

            def record(*args: Any) -> None:
                if name == "on_step":
                    assert isinstance(args[0], StepStats)
                    return
                events.append((name, args[0]))
                stamps.append(args[1])

            return record

    engine.add_hooks(Recorder())
    out = run(
        engine.complete("hooks", SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    )
    names = [name for name, rid in events if rid == out.request_id]
    assert names == [
        "on_enqueue",
        "on_schedule",
        "on_prefill_start",
        "on_prefill_end",
        "on_token",
        "on_detokenize",
        "on_token",
        "on_detokenize",
        "on_token",
        "on_detokenize",
        "on_blame",  # who made it wait, at its finish's time
        "on_finish",
    ]
    assert stamps == sorted(stamps)


def test_step_failure_fails_only_that_batch(engine: Engine) -> None:
    def fail_poisoned(request_ids: list[str]) -> None:
        if "poison" in request_ids:
            raise RuntimeError("injected fault")

    engine.worker.step_faults = fail_poisoned

    async def scenario() -> None:
        with pytest.raises(EngineStepFailed):
            async for _ in engine.generate("bad", GREEDY, request_id="poison"):
                pass
        healthy = await engine.complete("good", GREEDY)
        assert len(healthy.token_ids) == GREEDY.max_tokens

    run(scenario())
    assert engine.num_free_blocks == engine.num_blocks


def test_sampling_failure_ends_only_the_request_that_broke_it(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request whose parameters break sampling ends with an error; a request decoding in the
    same batch gets every token, and the steps after run as if it never came."""
    import engine.sampling as sampling

    sample = sampling.sample_tokens

    def fail_poisoned(logits: Any, params: Any, generators: Any) -> Any:
        if any(p.temperature == 0.7 for p in params):
            raise RuntimeError("injected sampling fault")
        return sample(logits, params, generators)

    monkeypatch.setattr(sampling, "sample_tokens", fail_poisoned)
    poisoned = SamplingParams(max_tokens=4, temperature=0.7)
    long = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)

    async def poison() -> None:
        await asyncio.sleep(0.05)  # joins the batch while the healthy one decodes
        with pytest.raises(EngineStepFailed):
            async for _ in engine.generate("bad", poisoned, request_id="poison"):
                pass

    async def scenario() -> None:
        healthy, _ = await asyncio.gather(engine.complete("good", long), poison())
        assert len(healthy.token_ids) == long.max_tokens
        after = await engine.complete("good", GREEDY)
        assert len(after.token_ids) == GREEDY.max_tokens

    run(scenario())
    assert engine.num_free_blocks == engine.num_blocks


def test_cold_start_is_measured(engine: Engine) -> None:
    engine.start_sync()
    cold = engine.cold_start
    assert cold is not None and cold.load_s > 0 and cold.warmup_s > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_stats_report_the_cuda_devices(checkpoint: Path) -> None:
    """With the engine's weights on a CUDA device, NVML reports every device torch sees, each
    by its name and total memory, and the one in use holds at least what torch allocated."""
    engine = make_engine(checkpoint, device="cuda")
    try:
        engine.start_sync()
        allocated = torch.cuda.memory_allocated(0)
        reading = engine.gpu_stats()
        stats = reading.devices
        _free, total = torch.cuda.mem_get_info(0)
    finally:
        engine.stop_sync()
    assert allocated > 0 and reading.errors == 0, reading
    # NVML lists every device on the machine, CUDA_VISIBLE_DEVICES or not, by its own index.
    assert len(stats) >= torch.cuda.device_count(), stats
    assert [s.index for s in stats] == list(range(len(stats)))
    for s in stats:
        assert 0 <= s.utilization_percent <= 100, s
        assert 0 < s.memory_used_bytes <= s.memory_total_bytes, s
    # The device the engine runs on, by name and size: NVML's total is CUDA's plus what the
    # driver reserves (a few percent); what it counts in use holds all that torch allocated.
    ours = [
        s
        for s in stats
        if s.name == torch.cuda.get_device_name(0) and total <= s.memory_total_bytes <= total * 1.05
    ]
    assert ours, (torch.cuda.get_device_name(0), total, stats)
    assert max(s.memory_used_bytes for s in ours) >= allocated, (allocated, stats)


def test_complete_delivers_once_with_what_the_stream_delivers(engine: Engine) -> None:
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop=("zz",))

    async def streamed() -> tuple[str, tuple[int, ...], str | None]:
        pieces = [out async for out in engine.generate("deliver once", params)]
        text = "".join(p.text for p in pieces)
        ids = tuple(t for p in pieces for t in p.token_ids)
        return text, ids, pieces[-1].finish_reason

    async def deliveries() -> list[Any]:
        stream = engine.submit("deliver once", params, streaming=False)
        return [out async for out in stream]

    outputs = run(deliveries())
    # The first token (for first-token deadlines) and the rest at the end: not one wake-up
    # of the caller's event loop per token.
    assert [len(o.token_ids) for o in outputs] == [1, 19]
    assert [o.finish_reason is None for o in outputs] == [True, False]
    whole = run(engine.complete("deliver once", params))
    assert (whole.text, whole.token_ids, whole.finish_reason) == run(streamed())
    assert whole.completion_tokens == len(whole.token_ids) == outputs[-1].completion_tokens
    assert engine.num_free_blocks == engine.num_blocks


def test_cancelling_complete_cancels_the_request(engine: Engine) -> None:
    slow = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)

    async def cancel_midway() -> None:
        task = asyncio.create_task(engine.complete("cancel me", slow))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await engine.wait_idle()

    run(cancel_midway())
    assert engine.num_free_blocks == engine.num_blocks


def mkl_threads() -> int | None:
    """MKL's thread count, which is process-wide (OpenMP's is per thread)."""
    for line in torch.__config__.parallel_info().splitlines():
        if "mkl_get_max_threads()" in line:
            return int(line.rsplit(":", 1)[1])
    return None


def test_worker_keeps_its_thread_count_when_another_thread_changes_it(checkpoint: Path) -> None:
    if mkl_threads() is None:
        pytest.skip("this torch build has no MKL, whose thread count is the process-wide one")
    engine = make_engine(checkpoint, cpu_threads=1)
    seen: list[int | None] = []

    class StepProbe:
        def on_step(self, stats: StepStats) -> None:
            seen.append(mkl_threads())

    previous = torch.get_num_threads()
    try:
        engine.start_sync()
        torch.set_num_threads(2)  # e.g. a warm-up or a library restoring its own setting
        engine.add_hooks(StepProbe())
        run(engine.complete("threads", SamplingParams(max_tokens=3, temperature=0)))
    finally:
        torch.set_num_threads(previous)
        engine.stop_sync()
    assert seen and set(seen) == {1}
