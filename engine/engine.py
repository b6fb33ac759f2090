"""The engine: a worker thread that runs scheduler steps, and an async API that streams results.

engine = Engine.from_pretrained("bundled:tiny")
await engine.start()
async for out in engine.generate("Hello", SamplingParams(max_tokens=16), priority=0):
    print(out.text, end="")
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from engine import runner
from engine.compiled import compile_forward
from engine.config import CheckpointError, EngineConfig, ModelConfig
from engine.gpu import GpuStats, read_gpu_stats
from engine.kv_cache import PagedKVCache, blocks_needed
from engine.loader import load_model, resolve_checkpoint, resolve_device, resolve_dtype
from engine.model import LlamaForCausalLM
from engine.outputs import (
    EngineOverloaded,
    EngineStopped,
    RequestOutput,
    RequestTooLarge,
)
from engine.quantize import quantize_model
from engine.sampling import SamplingParams
from engine.scheduler import Scheduler, Sequence
from engine.speculative import SpeculativeDecoder
from engine.stream import ColdStart, EngineTotals, HookDispatch, RequestStream
from engine.tokenizer import IncrementalDetokenizer, Tokenizer
from engine.worker import EngineWorker

logger = logging.getLogger("engine")

__all__ = ["ColdStart", "Engine", "EngineTotals", "RequestStream"]


class Engine(EngineWorker):
    def __init__(
        self,
        model: LlamaForCausalLM,
        tokenizer: Tokenizer,
        model_config: ModelConfig,
        config: EngineConfig | None = None,
        name: str = "model",
        load_s: float = 0.0,
        draft: LlamaForCausalLM | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.model = model
        self.tokenizer = tokenizer
        self.model_config = model_config
        self.name = name
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.max_model_len = min(
            self.config.max_model_len or model_config.max_position_embeddings,
            model_config.max_position_embeddings,
        )
        self.max_tokens_cap = self.config.max_tokens_cap or self.max_model_len
        block_size = self.config.block_size
        num_blocks = self.config.num_kv_blocks or max(
            blocks_needed(self.max_model_len, block_size),
            self.config.kv_cache_bytes
            // PagedKVCache.bytes_per_block(model_config, block_size, self.dtype),
        )
        self.cache = PagedKVCache(
            model_config,
            num_blocks,
            block_size,
            self.dtype,
            self.device,
            enable_caching=self.config.enable_prefix_caching,
        )
        self.scheduler = Scheduler(
            self.cache.allocator,
            block_size,
            self.config.max_batch_size,
            max(self.config.max_prefill_tokens, self.max_model_len),
            num_speculative=self.config.num_speculative_tokens if draft is not None else 0,
        )
        self.totals = EngineTotals()
        self._hooks = HookDispatch()
        self._lock = threading.Condition()
        self._incoming: list[Sequence] = []
        self._aborted: set[str] = set()
        self._sequences: dict[str, Sequence] = {}
        self._arrivals = itertools.count()
        # uuid4 reads the OS entropy pool per call (slow on some VMs): prefix + counter instead.
        self._id_prefix = os.urandom(6).hex()
        self._ids = itertools.count(1)
        self._worker: threading.Thread | None = None
        self._stopping = False
        self._step_count = 0
        self._default_generator = torch.Generator(device=self.device).manual_seed(self.config.seed)
        self._load_s = load_s
        self._warmup_s: float | None = None
        self.step_faults: Callable[[list[str]], None] | None = (
            None  # test hook: raise to fail a step
        )
        self.speculative: SpeculativeDecoder | None = None
        if draft is not None:
            # Same block ids as the target's cache, so prefix-cached blocks hold both.
            draft_cache = PagedKVCache(
                draft.config, num_blocks, block_size, self.dtype, self.device
            )
            self.speculative = SpeculativeDecoder(
                draft, draft_cache, self.config.num_speculative_tokens, self._default_generator
            )

    # ----------------------------------------------------------------- construction, lifecycle
    @classmethod
    def from_pretrained(
        cls, name_or_path: str | Path = "bundled:tiny", config: EngineConfig | None = None
    ) -> Engine:
        """Load a Hugging Face-format Llama checkpoint directory, or a bundled model by name."""
        config = config or EngineConfig()
        started = time.perf_counter()
        directory = resolve_checkpoint(name_or_path)
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device)
        model, model_config = load_model(directory, device, dtype)
        draft = None
        if config.draft_model is not None:
            draft, draft_config = load_model(resolve_checkpoint(config.draft_model), device, dtype)
            if draft_config.vocab_size != model_config.vocab_size:
                raise CheckpointError(
                    f"draft model '{config.draft_model}' has vocab_size "
                    f"{draft_config.vocab_size}, the target {model_config.vocab_size}; a draft "
                    "must share the target's tokenizer"
                )
        if config.quantization == "int8":
            for loaded in (model, draft):
                if loaded is not None:
                    quantize_model(loaded)
        tokenizer = Tokenizer(directory, model_config.eos_token_ids)
        name = str(name_or_path) if str(name_or_path).startswith("bundled:") else directory.name
        return cls(
            model,
            tokenizer,
            model_config,
            config,
            name=name,
            load_s=time.perf_counter() - started,
            draft=draft,
        )

    @property
    def started(self) -> bool:
        return self._worker is not None

    @property
    def cold_start(self) -> ColdStart | None:
        """Load and warm-up time, once the engine has started."""
        if self._warmup_s is None:
            return None
        return ColdStart(load_s=self._load_s, warmup_s=self._warmup_s)

    async def start(self) -> None:
        """Warm up (off the event loop) and start the worker thread."""
        if self._worker is None:
            await asyncio.to_thread(self._warm_up)
            self._start_worker()

    def start_sync(self) -> None:
        if self._worker is None:
            self._warm_up()
            self._start_worker()

    def _start_worker(self) -> None:
        if self._worker is None:
            self._stopping = False
            self._worker = threading.Thread(target=self._run, name="engine-worker", daemon=True)
            self._worker.start()

    def _warm_up(self) -> None:
        started = time.perf_counter()
        if self.config.compile and self.model.compiled_forward is None:
            # Every position's RoPE angles now: a table growing inside the graph would recompile.
            self.model.rope(torch.zeros(1, dtype=torch.long), self.dtype, self.max_model_len - 1)
            self.model.compiled_forward = compile_forward(self.model.forward, self.device)
        if self.config.warmup or self.config.compile:
            previous_threads = torch.get_num_threads()
            if self.device.type == "cpu":  # inductor sizes its kernels' thread pools now
                torch.set_num_threads(self.worker_threads)
            try:
                with torch.inference_mode():
                    self._run_probes(2 if self.config.compile else 1)
            finally:
                torch.set_num_threads(previous_threads)
        self._warmup_s = time.perf_counter() - started

    def probe_sequence(self, request_id: str, prompt_ids: list[int]) -> Sequence:
        """A greedy sequence for driving `runner` by hand (warm-up, tests): never scheduled,
        its outputs go nowhere. The caller allocates and frees its blocks."""
        return Sequence(
            request_id=request_id,
            prompt_ids=prompt_ids,
            params=SamplingParams(max_tokens=2, temperature=0),
            priority=0,
            arrival=-1,
            detokenizer=IncrementalDetokenizer(self.tokenizer),
            deliver=lambda _: None,
        )

    def _run_probes(self, batch_sizes: int) -> None:
        """Prefill and decode short probe requests, decoding at batch 1..`batch_sizes` (a
        compiled forward has one graph for a single sequence and one for larger batches)."""
        prompt = [0] * min(8, self.max_model_len - 2)
        probes = [self.probe_sequence(f"warmup-{index}", prompt) for index in range(batch_sizes)]
        try:
            for probe in probes:
                self.cache.ensure_capacity(probe.block_table, probe.num_tokens + 2)
                logits = self._prefill(self.model, self.cache, [probe])
                probe.output_ids.append(int(logits[0].argmax()))
            if self.speculative is not None:
                self.speculative.step(self.model, self.cache, probes[:1])
            else:
                for size in range(1, batch_sizes + 1):
                    runner.decode(self.model, self.cache, probes[:size])
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        finally:
            for probe in probes:
                self.cache.allocator.free(probe.block_table)

    async def stop(self) -> None:
        await asyncio.to_thread(self.stop_sync)

    def stop_sync(self) -> None:
        """Stop the worker; requests still in the engine end with EngineStopped."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._worker is not None:
            self._worker.join(timeout=30)
            self._worker = None
        for sequence in self.scheduler.all_sequences() + self._incoming:
            self.scheduler.remove(sequence)
            sequence.deliver(EngineStopped("the engine was stopped"))
        self._incoming.clear()
        self._sequences.clear()

    # ----------------------------------------------------------------------------- hooks
    def add_hooks(self, hooks: Any) -> None:
        """Register an object with any of the `EngineHooks` methods."""
        with self._lock:
            self._hooks.hooks.append(hooks)
            self._hooks.rebuild()

    def remove_hooks(self, hooks: Any) -> None:
        with self._lock:
            self._hooks.hooks.remove(hooks)
            self._hooks.rebuild()

    # ------------------------------------------------------------------------- requests
    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        return list(prompt)

    def check_fits(self, prompt_tokens: int, max_tokens: int) -> None:
        """Raise RequestTooLarge with a message saying what to change."""
        if prompt_tokens == 0:
            raise RequestTooLarge("the prompt is empty; send at least one token of text")
        if max_tokens > self.max_tokens_cap:
            raise RequestTooLarge(
                f"max_tokens is {max_tokens}, above this server's cap of {self.max_tokens_cap}; "
                f"ask for at most {self.max_tokens_cap}"
            )
        if prompt_tokens + max_tokens > self.max_model_len:
            raise RequestTooLarge(
                f"the prompt has {prompt_tokens} tokens and max_tokens is {max_tokens}, "
                f"together above the model's context of {self.max_model_len} tokens; shorten "
                "the prompt or lower max_tokens to at most "
                f"{max(self.max_model_len - prompt_tokens, 0)}"
            )
        capacity = self.cache.num_blocks * self.cache.block_size
        if prompt_tokens + max_tokens > capacity:
            raise RequestTooLarge(
                f"prompt plus max_tokens ({prompt_tokens + max_tokens}) exceeds the KV cache "
                f"({capacity} tokens); lower max_tokens or raise num_kv_blocks"
            )

    def submit(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        request_id: str | None = None,
        streaming: bool = True,
    ) -> RequestStream:
        """Queue a request now (raising EngineOverloaded or RequestTooLarge at once).

        With `streaming=False` the stream yields two outputs, the first token and the rest
        when the request ends: the caller's event loop is not woken once per token, and a
        first-token deadline still works.
        """
        params = params or SamplingParams()
        if self._worker is None:
            self.start_sync()
        prompt_ids = self.encode_prompt(prompt)
        self.check_fits(len(prompt_ids), params.max_tokens)
        request_id = request_id or f"req-{self._id_prefix}{next(self._ids):x}"
        stream = RequestStream(self, request_id, len(prompt_ids))
        generator = None
        if not params.greedy and params.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(params.seed)
        sequence = Sequence(
            request_id=request_id,
            prompt_ids=prompt_ids,
            params=params,
            priority=priority,
            arrival=next(self._arrivals),
            detokenizer=IncrementalDetokenizer.for_prompt(self.tokenizer, prompt_ids),
            deliver=stream._deliver,
            generator=generator,
            streaming=streaming,
        )
        with self._lock:
            if self._stopping:
                raise EngineStopped("the engine is stopping; retry against another replica")
            waiting = len(self._incoming) + self.scheduler.num_waiting
            if waiting >= self.config.max_waiting:
                raise EngineOverloaded(
                    f"{waiting} requests are already waiting (limit {self.config.max_waiting}); "
                    "retry shortly",
                    retry_after_s=1.0,
                )
            if request_id in self._sequences:
                raise ValueError(f"request id '{request_id}' is already in use")
            self._sequences[request_id] = sequence
            for hook in self._hooks.by_event["on_enqueue"]:
                hook(request_id, time.perf_counter_ns(), len(prompt_ids), priority)
            self._incoming.append(sequence)
            self._lock.notify()
        return stream

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        request_id: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's output; leaving the loop early cancels the request."""
        stream = self.submit(prompt, params, priority, request_id)
        try:
            async for output in stream:
                yield output
        finally:
            stream.cancel()

    async def complete(
        self, prompt: str | list[int], params: SamplingParams | None = None, priority: int = 0
    ) -> RequestOutput:
        """Run one request to the end; returns all its text and token ids in one output.

        The engine hands over the first token and then the rest at the end (as vLLM does for
        requests that do not stream), so waiting costs the event loop nothing per token.
        Cancelling the awaiting task cancels the request.
        """
        stream = self.submit(prompt, params, priority, streaming=False)
        text: list[str] = []
        token_ids: list[int] = []
        try:
            async for output in stream:
                text.append(output.text)
                token_ids.extend(output.token_ids)
                if output.finish_reason is not None:
                    return replace(output, text="".join(text), token_ids=tuple(token_ids))
        finally:
            stream.cancel()
        raise AssertionError("a request stream ended without a finished output")

    def abort(self, request_id: str) -> None:
        """Cancel a request from any thread; its blocks are freed at the start of the next step."""
        with self._lock:
            if request_id in self._sequences:
                self._aborted.add(request_id)
                self._lock.notify()

    # --------------------------------------------------------------------------- status
    @property
    def num_free_blocks(self) -> int:
        return self.cache.allocator.num_free

    @property
    def num_blocks(self) -> int:
        return self.cache.num_blocks

    @property
    def num_active_requests(self) -> int:
        with self._lock:
            return len(self._sequences)

    def gpu_stats(self) -> list[GpuStats]:
        return read_gpu_stats()

    async def wait_idle(self, timeout_s: float = 10.0) -> None:
        """Wait until no request is in the engine (tests, graceful shutdown)."""
        deadline = time.monotonic() + timeout_s
        while self.num_active_requests:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.num_active_requests} requests still in the engine")
            await asyncio.sleep(0.005)
