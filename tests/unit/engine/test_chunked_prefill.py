"""Chunked prefill through the real engine: same greedy tokens, hooks across chunks, sheds."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from engine import Engine, RequestShed, SamplingParams, StepStats  # noqa: E402
from tests.helpers.checkpoints import checkpoint_fixture, make_engine  # noqa: E402

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
# Lengths around the 16-token budget: shorter, one chunk and a bit, several chunks.
PROMPTS = ["hi", "short prompt " * 2, "a longer prompt that spans chunks " * 4, "xyz " * 40]


checkpoint = checkpoint_fixture(seed=11)


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.steps: list[StepStats] = []

    def on_prefill_start(self, request_id: str, time_ns: int, num_tokens: int) -> None:
        self.events.append(("start", request_id))

    def on_prefill_end(self, request_id: str, time_ns: int) -> None:
        self.events.append(("end", request_id))

    def on_token(self, request_id: str, time_ns: int, token_index: int) -> None:
        self.events.append(("token", request_id))

    def on_step(self, stats: StepStats) -> None:
        self.steps.append(stats)


def generate_all(engine: Engine, prompts: list[str], params: SamplingParams) -> list[Any]:
    async def together() -> list[Any]:
        outs = await asyncio.gather(*(engine.complete(p, params) for p in prompts))
        return [o.token_ids for o in outs]

    return asyncio.run(together())


@pytest.mark.parametrize("scheduling", ["fifo", "priority", "slo"])
def test_chunked_and_unchunked_greedy_outputs_are_equal(checkpoint: Path, scheduling: str) -> None:
    whole = make_engine(checkpoint, max_num_batched_tokens=4096, scheduling=scheduling)
    chunked = make_engine(checkpoint, max_num_batched_tokens=16, scheduling=scheduling)
    recorder = Recorder()
    chunked.add_hooks(recorder)
    try:
        expected = generate_all(whole, PROMPTS, GREEDY)
        assert generate_all(chunked, PROMPTS, GREEDY) == expected
    finally:
        whole.stop_sync()
        chunked.stop_sync()
    assert all(len(ids) == GREEDY.max_tokens for ids in expected)
    # The budget held every step, and the long prompts really were cut into chunks.
    assert all(s.prefill_tokens + s.decode_tokens <= 16 for s in recorder.steps)
    assert sum(s.prefill_chunks for s in recorder.steps) > len(PROMPTS)
    # Prefill start and end once per request, around every chunk, before its first token.
    by_request: dict[str, list[str]] = {}
    for event, request_id in recorder.events:
        by_request.setdefault(request_id, []).append(event)
    assert len(by_request) == len(PROMPTS)
    for events in by_request.values():
        assert events[:2] == ["start", "end"] and events.count("start") == 1
        assert events.count("end") == 1 and events.count("token") == GREEDY.max_tokens


def test_a_long_prompt_never_stalls_a_running_decode(checkpoint: Path) -> None:
    engine = make_engine(checkpoint, max_num_batched_tokens=16)
    recorder = Recorder()
    engine.add_hooks(recorder)

    async def scenario() -> None:
        params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
        stream = engine.submit("go", params)
        await anext(stream)  # decoding now
        await engine.complete("xyz " * 60, SamplingParams(max_tokens=1, temperature=0))
        async for _ in stream:
            pass

    try:
        asyncio.run(scenario())
    finally:
        engine.stop_sync()
    chunk_steps = [s for s in recorder.steps if s.prefill_chunks and s.decode_tokens]
    assert len(chunk_steps) >= 3  # the long prompt took several steps, each with the decode


def test_an_unreachable_ttft_objective_sheds_the_request(checkpoint: Path) -> None:
    # A 1 us TTFT objective for priority 0 cannot be met once the prefill time is learned.
    engine = make_engine(
        checkpoint, scheduling="slo", tier_objectives={0: (1e-6, None)}, max_num_batched_tokens=16
    )
    recorder = Recorder()
    engine.add_hooks(recorder)

    async def scenario() -> tuple[list[Any], BaseException | None]:
        warm = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
        # Priority 1 has no objective: never shed, and its steps teach the prefill time.
        done = await asyncio.gather(*(engine.complete(p, warm, priority=1) for p in PROMPTS))
        try:
            await engine.complete("too late", warm, priority=0)
        except RequestShed as error:
            return list(done), error
        return list(done), None

    try:
        done, error = asyncio.run(scenario())
    finally:
        engine.stop_sync()
    assert all(len(o.token_ids) == 12 for o in done)
    assert isinstance(error, RequestShed) and error.reason == "ttft_out_of_reach"
    assert "TTFT objective" in str(error)
    shed = [entry for s in recorder.steps for entry in s.shed]
    assert shed == [(0, "ttft_out_of_reach")]
    assert engine.num_active_requests == 0 and engine.num_free_blocks == engine.num_blocks
