"""Warm-up before serving: compile the decode forward if asked, then run short probe requests."""

from __future__ import annotations

import time

import torch

import engine.runner as runner
from engine.compiled import compile_forward
from engine.sampling import SamplingParams
from engine.sequence import Sequence
from engine.tokenizer import IncrementalDetokenizer, Tokenizer
from engine.worker import EngineWorker


def probe_sequence(tokenizer: Tokenizer, request_id: str, prompt_ids: list[int]) -> Sequence:
    """A greedy sequence for driving `runner` by hand (warm-up, tests): never scheduled, its
    outputs go nowhere. The caller allocates and frees its blocks."""
    return Sequence(
        request_id=request_id,
        prompt_ids=prompt_ids,
        params=SamplingParams(max_tokens=2, temperature=0),
        priority=0,
        arrival=-1,
        detokenizer=IncrementalDetokenizer(tokenizer),
        deliver=lambda _: None,
    )


def warm_up(worker: EngineWorker) -> float:
    """Compile (with `EngineConfig.compile`) and run the probes; returns the seconds taken.
    Runs before the worker's thread starts, on the caller's thread."""
    started = time.perf_counter()
    config, model = worker.config, worker.model
    if config.compile and model.compiled_forward is None:
        # Every position's RoPE angles now: a table growing inside the graph would recompile.
        dtype = next(model.parameters()).dtype
        model.rope(torch.zeros(1, dtype=torch.long), dtype, worker.max_model_len - 1)
        # A sliding window masks contexts longer than itself: a branch the single-sequence
        # graph (built at a short context) does not contain, so it serves up to the window.
        window = model.config.sliding_window
        longest = worker.max_model_len if window is None else min(window, worker.max_model_len)
        model.compiled_forward = compile_forward(model.decode_logits, worker.device, longest)
    if config.warmup or config.compile:
        previous_threads = torch.get_num_threads()
        if worker.device.type == "cpu":  # inductor sizes its kernels' thread pools now
            torch.set_num_threads(worker.threads)
        try:
            with torch.inference_mode():
                run_probes(worker, 2 if config.compile else 1)
        finally:
            torch.set_num_threads(previous_threads)
    return time.perf_counter() - started


def run_probes(worker: EngineWorker, batch_sizes: int) -> None:
    """Prefill and decode short probe requests, decoding at batch 1..`batch_sizes` (a
    compiled forward has one graph for a single sequence and one for larger batches)."""
    model, cache = worker.model, worker.cache
    prompt = [0] * min(8, worker.max_model_len - 2)
    probes = [
        probe_sequence(worker.tokenizer, f"warmup-{index}", prompt) for index in range(batch_sizes)
    ]
    try:
        for probe in probes:
            cache.ensure_capacity(probe.block_table, probe.num_tokens + 2)
            logits = runner.prefill(model, cache, [probe])
            if worker.speculative is not None:
                worker.speculative.prefill([probe])
            probe.output_ids.append(int(logits[0].argmax()))
        if worker.speculative is not None:
            worker.speculative.step(model, cache, probes[:1])
        else:
            for size in range(1, batch_sizes + 1):
                runner.decode(model, cache, probes[:size])
        if worker.device.type == "cuda":
            torch.cuda.synchronize(worker.device)
    finally:
        for probe in probes:
            cache.allocator.free(probe.block_table)
