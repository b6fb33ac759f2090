"""A family of mixed-tier loads, drawn by seed: tier isolation judged on loads nobody tuned for.

Each draw (`LoadDraw`, from `draw_loads(seed, count)`) sets, within the family:
- premium: gamma-distributed arrivals (shape < 1 is bursty, 1 is Poisson, > 1 regular), short
  prompts of mixed lengths, a few dozen tokens each;
- the batch tier, one of: a flood of long prompts (closed-loop clients, ~600-900 tokens), many
  short requests (more clients, short prompts), or mixed lengths (each request's prompt drawn
  from 20 to 900 characters);
- sometimes a third tier between them (`standard`, Poisson arrivals, medium prompts).

A draw prints as one line (`LoadDraw.describe`) with its seed, so a failing one replays with
`draw_load(seed)`. Runs reuse the overload's timing (`engine.workloads.overload`).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Unpack

from engine.engine import Engine
from engine.sampling import SamplingParams
from engine.workloads.overload import (
    EngineOptions,
    OverloadRun,
    RequestTiming,
    run_on_engine,
    timed_complete,
    timed_request,
)

BATCH_KINDS = ("flood", "short", "mixed")
TIER_PRIORITY = {"premium": 0, "standard": 1, "batch": 2}  # the packaged example spec's


@dataclass(frozen=True)
class LoadDraw:
    seed: int
    premium_shape: float  # gamma shape of premium inter-arrival times
    premium_interval_s: float  # their mean
    premium_prompt_chars: tuple[int, int]
    premium_max_tokens: int
    batch_kind: str
    batch_clients: int
    batch_prompt_chars: tuple[int, int]
    batch_max_tokens: int
    standard_rate: float  # requests/s of the third tier; 0: none

    def describe(self) -> str:
        third = f", standard {self.standard_rate:.1f}/s" if self.standard_rate else ""
        return (
            f"seed {self.seed}: premium gamma(k={self.premium_shape:.2f}) every "
            f"{self.premium_interval_s * 1000:.0f} ms, {self.premium_max_tokens} tokens; batch "
            f"{self.batch_kind} x{self.batch_clients}, prompts {self.batch_prompt_chars[0]}-"
            f"{self.batch_prompt_chars[1]} chars, {self.batch_max_tokens} tokens{third}"
        )


def draw_load(seed: int) -> LoadDraw:
    """The family's draw for `seed` (the same seed, the same load)."""
    rng = random.Random(seed)
    kind = BATCH_KINDS[seed % len(BATCH_KINDS)]  # any 3 consecutive seeds cover every kind
    if kind == "flood":
        clients, chars, tokens = rng.randint(8, 24), (600, 900), rng.randint(32, 96)
    elif kind == "short":
        clients, chars, tokens = rng.randint(16, 48), (20, 120), rng.randint(8, 32)
    else:
        clients, chars, tokens = rng.randint(8, 32), (20, 900), rng.randint(16, 64)
    low = rng.randint(20, 120)
    return LoadDraw(
        seed=seed,
        premium_shape=rng.choice((0.3, 0.6, 1.0, 3.0)),
        premium_interval_s=rng.uniform(0.15, 0.4),
        premium_prompt_chars=(low, low + rng.randint(0, 120)),
        premium_max_tokens=rng.randint(8, 32),
        batch_kind=kind,
        batch_clients=clients,
        batch_prompt_chars=chars,
        batch_max_tokens=tokens,
        standard_rate=rng.uniform(1.0, 4.0) if seed % 2 else 0.0,  # a third tier every other
    )


def draw_loads(seed: int, count: int) -> list[LoadDraw]:
    """`count` draws; draw i has seed `seed + i`."""
    return [draw_load(seed + index) for index in range(count)]


def _prompt(rng: random.Random, tier: str, chars: tuple[int, int]) -> str:
    length = rng.randint(*chars)
    words = " ".join(f"{tier} item {rng.randint(0, 999)} ok" for _ in range(length // 12 + 1))
    return words[:length]


async def _drive(engine: Engine, draw: LoadDraw, duration_s: float) -> list[RequestTiming]:
    stop_at = time.perf_counter() + duration_s
    rng = random.Random(draw.seed * 7919 + 1)

    async def arrivals(
        tier: str, gaps: list[float], chars: tuple[int, int], tokens: int
    ) -> list[RequestTiming]:
        params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        tasks = []
        for gap in gaps:
            if time.perf_counter() >= stop_at:
                break
            prompt = _prompt(rng, tier, chars)
            request = timed_request(engine, tier, prompt, params, TIER_PRIORITY[tier])
            tasks.append(asyncio.ensure_future(request))
            await asyncio.sleep(gap)
        return list(await asyncio.gather(*tasks))

    async def batch_client(client: int) -> list[RequestTiming]:
        params = SamplingParams(max_tokens=draw.batch_max_tokens, temperature=0, ignore_eos=True)
        client_rng = random.Random(draw.seed * 104729 + client)
        done: list[RequestTiming] = []
        priority = TIER_PRIORITY["batch"]
        while time.perf_counter() < stop_at:
            prompt = _prompt(client_rng, "batch", draw.batch_prompt_chars)
            # Offline jobs read the whole reply (no stream), as in the overload.
            done.append(await timed_complete(engine, "batch", prompt, params, priority))
        return done

    count = int(duration_s / min(draw.premium_interval_s, 0.1)) + 2  # more than enough gaps
    shape = draw.premium_shape
    premium_gaps = [rng.gammavariate(shape, draw.premium_interval_s / shape) for _ in range(count)]
    groups = [arrivals("premium", premium_gaps, draw.premium_prompt_chars, draw.premium_max_tokens)]
    if draw.standard_rate:
        gaps = [rng.expovariate(draw.standard_rate) for _ in range(count)]
        groups.append(arrivals("standard", gaps, (100, 400), 32))
    groups += [batch_client(client) for client in range(draw.batch_clients)]
    results = await asyncio.gather(*groups)
    return [timing for group in results for timing in group]


def run_draw(
    model: str, policy: str, draw: LoadDraw, duration_s: float, **options: Unpack[EngineOptions]
) -> OverloadRun:
    """One draw on a fresh engine under `policy`; the budget left out is None: `slo serve`'s
    default."""
    options.setdefault("max_num_batched_tokens", None)
    return run_on_engine(model, policy, lambda engine: _drive(engine, draw, duration_s), **options)
