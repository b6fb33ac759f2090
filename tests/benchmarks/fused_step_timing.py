"""Timing one engine step's forward: decode-only, fused (decodes + a prefill chunk in one
pass) and two passes (the chunk, then the decodes), on the same cache state.

Used by tests/benchmarks/test_fused_step.py; no pytest here, so it can be run by hand too.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine import Engine
from engine.chunked import prefill_chunks
from engine.fused import fused_forward
from engine.runner import decode
from engine.sampling import SamplingParams
from engine.sequence import Sequence

BATCH = 16  # decodes running
DECODE_CONTEXT = 128  # tokens of context each decode has
LONG_PROMPT = 900  # the prompt chunked alongside


@dataclass(frozen=True)
class StepTimes:
    chunk: int  # prefill tokens per step
    decode_s: float  # median decode-only step
    fused_s: float  # median fused step (one forward)
    two_pass_s: float  # median step of the chunk's pass then the decodes'

    @property
    def fused_ratio(self) -> float:
        return self.fused_s / self.decode_s

    @property
    def two_pass_ratio(self) -> float:
        return self.two_pass_s / self.decode_s


def _sequence(engine: Engine, name: str, tokens: int) -> Sequence:
    sequence = Sequence(
        request_id=name,
        prompt_ids=[(7 * i + len(name)) % 200 + 1 for i in range(tokens)],
        params=SamplingParams(max_tokens=8, temperature=0),
        priority=0,
        arrival=0,
        detokenizer=None,  # type: ignore[arg-type]  # never detokenized
        deliver=lambda _: None,
    )
    engine.worker.cache.ensure_capacity(sequence.block_table, tokens + 2)
    return sequence


def _median_s(run: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    times = []
    for _ in range(repeats):
        sync()
        started = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(engine: Engine, chunks: list[int], repeats: int) -> list[StepTimes]:
    """Median step times at each chunk size, the decodes' context the same in every run."""
    worker = engine.worker
    model, cache = worker.model, worker.cache
    decodes = [_sequence(engine, f"d{i}", DECODE_CONTEXT) for i in range(BATCH)]
    long = _sequence(engine, "long", LONG_PROMPT)
    device = cache.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    results = []
    with torch.inference_mode():
        prefill_chunks(model, cache, decodes, [DECODE_CONTEXT] * BATCH)
        for sequence in decodes:
            sequence.output_ids.append(5)
        for chunk in chunks:
            results.append(_measure_chunk(engine, decodes, long, chunk, repeats, sync))
    return results


def _measure_chunk(
    engine: Engine,
    decodes: list[Sequence],
    long: Sequence,
    chunk: int,
    repeats: int,
    sync: Callable[[], None],
) -> StepTimes:
    model, cache = engine.worker.model, engine.worker.cache
    start = LONG_PROMPT - chunk - 1  # the chunk ends short of the prompt, as mid-prefill

    def reset() -> None:
        for sequence in decodes:
            sequence.num_cached = DECODE_CONTEXT  # the same token decoded again, same place
        long.num_cached = start

    def only_decode() -> None:
        reset()
        decode(model, cache, decodes)

    def fused() -> None:
        reset()
        fused_forward([(long, chunk)])(model, cache, [*decodes, long])

    def two_pass() -> None:
        reset()
        prefill_chunks(model, cache, [long], [chunk])
        decode(model, cache, decodes)

    runs = {"decode": only_decode, "fused": fused, "two": two_pass}
    for run in runs.values():  # warm every shape once
        run()
    # Interleaved rounds, so the machine's other load falls on all three alike; the best
    # round's median of each.
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(3):
        for name, run in runs.items():
            best[name] = min(best[name], _median_s(run, repeats, sync))
    return StepTimes(chunk, best["decode"], best["fused"], best["two"])
