"""Run one workload against the embedded engine, once per serving technique (`slo compare`).

Every variant gets a fresh engine (so no variant inherits another's warm prefix cache), the
same prompts, output lengths and arrival offsets, and greedy decoding with EOS ignored, so
the token counts match across variants and the baseline's tokens are a quality reference.
Timing is taken at the caller, as a client in the same process would see it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.outputs import EngineTotals
from engine.sampling import SamplingParams


@dataclass(frozen=True)
class WorkItem:
    prompt: str
    max_tokens: int
    offset_s: float  # when to send, after the run starts


@dataclass
class VariantRun:
    variant: str
    ttft_s: list[float]
    tpot_s: list[float]  # requests with at least two tokens
    token_ids: list[tuple[int, ...]]
    wall_s: float
    cpu_s: float
    totals: EngineTotals
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def output_tokens(self) -> int:
        return sum(len(ids) for ids in self.token_ids)


def variant_overrides(
    variant: str, draft_model: str, num_speculative_tokens: int
) -> dict[str, Any]:
    """EngineConfig fields that make a variant; `batching` switches continuous batching off
    (one sequence at a time), so its ratio to the baseline is what batching buys."""
    overrides: dict[str, dict[str, Any]] = {
        "baseline": {},
        "int8": {"quantization": "int8"},
        "prefix-cache": {"enable_prefix_caching": True},
        "speculative": {
            "draft_model": draft_model,
            "num_speculative_tokens": num_speculative_tokens,
        },
        "batching": {"max_batch_size": 1},
    }
    if variant not in overrides:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(overrides)}")
    return overrides[variant]


async def _drive(
    engine: Engine, work: list[WorkItem]
) -> list[tuple[float, float, float, list[int]]]:
    started = time.perf_counter()

    async def one(item: WorkItem) -> tuple[float, float, float, list[int]]:
        await asyncio.sleep(max(0.0, started + item.offset_s - time.perf_counter()))
        sent = time.perf_counter()
        first = 0.0
        ids: list[int] = []
        params = SamplingParams(max_tokens=item.max_tokens, temperature=0, ignore_eos=True)
        async for output in engine.generate(item.prompt, params):
            if output.token_ids and not first:
                first = time.perf_counter()
            ids.extend(output.token_ids)
        return sent, first, time.perf_counter(), ids

    return list(await asyncio.gather(*(one(item) for item in work)))


def run_variant(
    model: str,
    variant: str,
    work: list[WorkItem],
    *,
    draft_model: str = "bundled:small-draft",
    num_speculative_tokens: int = 4,
    device: str = "auto",
    seed: int = 0,
    threads: int | None = None,
) -> VariantRun:
    previous_threads = torch.get_num_threads()
    if threads:
        # On a shared CPU, intra-op threads wait on each other at every op's barrier; one
        # thread per engine keeps small-model runs steady enough to compare.
        torch.set_num_threads(threads)
    try:
        return _run(model, variant, work, draft_model, num_speculative_tokens, device, seed)
    finally:
        torch.set_num_threads(previous_threads)


def _run(
    model: str,
    variant: str,
    work: list[WorkItem],
    draft_model: str,
    num_speculative_tokens: int,
    device: str,
    seed: int,
) -> VariantRun:
    overrides = variant_overrides(variant, draft_model, num_speculative_tokens)
    config = EngineConfig(device=device, seed=seed, max_waiting=max(256, len(work)), **overrides)
    engine = Engine.from_pretrained(model, config)
    engine.start_sync()  # load and warm-up stay outside the measured window
    try:
        cpu_started = time.process_time()
        wall_started = time.perf_counter()
        results = asyncio.run(_drive(engine, work))
        wall_s = time.perf_counter() - wall_started
        cpu_s = time.process_time() - cpu_started
    finally:
        engine.stop_sync()
    ttft = [first - sent for sent, first, _, _ in results]
    tpot = [(end - first) / (len(ids) - 1) for _, first, end, ids in results if len(ids) > 1]
    return VariantRun(
        variant=variant,
        ttft_s=ttft,
        tpot_s=tpot,
        token_ids=[tuple(ids) for _, _, _, ids in results],
        wall_s=wall_s,
        cpu_s=cpu_s,
        totals=engine.totals,
        config=overrides,
    )
