"""The mixed-tier overload: premium requests at a steady rate beside a batch-tier flood.

Premium: short prompts, `premium_max_tokens` tokens, one every `premium_interval_s`. Batch:
`batch_clients` closed-loop clients, long prompts, `batch_max_tokens` tokens each. Run once
without the flood (premium alone, the reference) and once with it per scheduling policy; the
timings are taken where the caller reads the stream, as a client in the same process sees
them. Used by the benchmark (tests/benchmarks) and by `slo compare --variants fifo,...`;
judging against objectives is left to the caller (the SLO arithmetic lives in `slo`).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypedDict, Unpack

from engine.config import EngineConfig
from engine.engine import Engine
from engine.outputs import RequestShed
from engine.sampling import SamplingParams

PREMIUM, BATCH = "premium", "batch"


@dataclass(frozen=True)
class OverloadWorkload:
    duration_s: float = 6.0  # how long requests are sent; in-flight ones then finish
    premium_interval_s: float = 0.2
    premium_max_tokens: int = 16
    premium_priority: int = 0
    batch_clients: int = 24
    batch_prompt_chars: int = 900  # ~900 tokens with the bundled byte-level tokenizer
    batch_max_tokens: int = 64
    batch_priority: int = 2


@dataclass
class RequestTiming:
    tier: str
    outcome: str  # "ok" or "shed"
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    output_tokens: int = 0

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass
class OverloadRun:
    policy: str
    flood: bool
    wall_s: float
    requests: list[RequestTiming]
    settings: dict[str, object] = field(default_factory=dict)

    def tier(self, name: str) -> list[RequestTiming]:
        return [r for r in self.requests if r.tier == name]

    def tokens_per_s(self, tier: str) -> float:
        return sum(r.output_tokens for r in self.tier(tier)) / self.wall_s if self.wall_s else 0.0


def _batch_prompt(client: int, chars: int) -> str:
    text = f"batch job {client}: summarize the following log lines. " + "".join(
        f"line {i} status ok latency {(i * 37 + client) % 997} ms; " for i in range(chars // 20)
    )
    return text[:chars]


async def timed_request(
    engine: Engine, tier: str, prompt: str, params: SamplingParams, priority: int
) -> RequestTiming:
    sent = time.perf_counter()
    timing = RequestTiming(tier, "ok")
    last = sent
    try:
        async for output in engine.generate(prompt, params, priority=priority):
            if not output.token_ids:
                continue
            now = time.perf_counter()
            if timing.ttft_s is None:
                timing.ttft_s = now - sent
            else:
                timing.itl_s.append(now - last)
            last = now
            timing.output_tokens = output.completion_tokens
    except RequestShed:
        timing.outcome = "shed"
        return timing
    timing.e2e_s = time.perf_counter() - sent
    return timing


async def timed_complete(
    engine: Engine, tier: str, prompt: str, params: SamplingParams, priority: int
) -> RequestTiming:
    """An offline job's request: the whole reply at once (no stream, so the event loop is not
    woken per token), timed end to end."""
    sent = time.perf_counter()
    timing = RequestTiming(tier, "ok")
    try:
        output = await engine.complete(prompt, params, priority)
    except RequestShed:
        timing.outcome = "shed"
    else:
        timing.e2e_s = time.perf_counter() - sent
        timing.output_tokens = output.completion_tokens
    return timing


async def _drive(engine: Engine, workload: OverloadWorkload, flood: bool) -> list[RequestTiming]:
    stop_at = time.perf_counter() + workload.duration_s
    premium_params = SamplingParams(
        max_tokens=workload.premium_max_tokens, temperature=0, ignore_eos=True
    )
    batch_params = SamplingParams(
        max_tokens=workload.batch_max_tokens, temperature=0, ignore_eos=True
    )

    async def premium() -> list[RequestTiming]:
        tasks = []
        index = 0
        while time.perf_counter() < stop_at:
            prompt = f"Premium question {index}: what is the status?"
            tasks.append(
                asyncio.ensure_future(
                    timed_request(
                        engine, PREMIUM, prompt, premium_params, workload.premium_priority
                    )
                )
            )
            index += 1
            await asyncio.sleep(workload.premium_interval_s)
        return list(await asyncio.gather(*tasks))

    async def batch_client(client: int) -> list[RequestTiming]:
        done: list[RequestTiming] = []
        priority = workload.batch_priority
        prompt = _batch_prompt(client, workload.batch_prompt_chars)
        while time.perf_counter() < stop_at:
            done.append(await timed_complete(engine, BATCH, prompt, batch_params, priority))
        return done

    clients = [batch_client(c) for c in range(workload.batch_clients)] if flood else []
    results = await asyncio.gather(premium(), *clients)
    return [timing for group in results for timing in group]


class EngineOptions(TypedDict, total=False):
    """How `run_on_engine` sets up its engine, as the runs built on it pass them on; one left
    out takes `run_on_engine`'s default."""

    tier_objectives: dict[int, tuple[float | None, float | None]] | None
    max_num_batched_tokens: int | None
    device: str
    cpu_threads: int | None


def run_overload(
    model: str,
    policy: str,
    workload: OverloadWorkload,
    *,
    flood: bool = True,
    **options: Unpack[EngineOptions],
) -> OverloadRun:
    """One run on a fresh engine (load and warm-up outside the measured window)."""
    drive = functools.partial(_drive, workload=workload, flood=flood)
    return run_on_engine(model, policy, drive, flood=flood, **options)


def run_on_engine(
    model: str,
    policy: str,
    drive: Callable[[Engine], Coroutine[Any, Any, list[RequestTiming]]],
    *,
    tier_objectives: dict[int, tuple[float | None, float | None]] | None = None,
    max_num_batched_tokens: int | None = 256,
    device: str = "auto",
    cpu_threads: int | None = 1,
    flood: bool = True,
) -> OverloadRun:
    """`drive` on a fresh engine under `policy`, timed (load and warm-up outside the window).
    `max_num_batched_tokens` None: the engine's default budget, as `slo serve` runs it."""
    config = EngineConfig(
        device=device,
        scheduling=policy,
        tier_objectives=dict(tier_objectives or {}),
        max_num_batched_tokens=max_num_batched_tokens,
        max_waiting=1024,
        cpu_threads=cpu_threads,
    )
    engine = Engine.from_pretrained(model, config)
    engine.start_sync()
    try:
        started = time.perf_counter()
        requests = asyncio.run(drive(engine))
        wall_s = time.perf_counter() - started
    finally:
        engine.stop_sync()
    return OverloadRun(policy, flood, wall_s, requests, engine.scheduling_settings())
