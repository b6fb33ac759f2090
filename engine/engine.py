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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine import runner
from engine.config import EngineConfig, ModelConfig
from engine.gpu import GpuStats, read_gpu_stats
from engine.hooks import HOOK_EVENTS, StepStats
from engine.kv_cache import PagedKVCache, blocks_needed
from engine.loader import load_model, resolve_checkpoint, resolve_device, resolve_dtype
from engine.model import LlamaForCausalLM
from engine.outputs import (
    EngineOverloaded,
    EngineStepFailed,
    EngineStopped,
    RequestOutput,
    RequestTooLarge,
)
from engine.sampling import SamplingParams, held_back_length, sample_token, stop_string_hit
from engine.scheduler import Scheduler, Sequence
from engine.tokenizer import IncrementalDetokenizer, Tokenizer

logger = logging.getLogger("engine")


@dataclass(frozen=True)
class ColdStart:
    """How long the engine took to become ready: reading weights, then the warm-up forward."""

    load_s: float
    warmup_s: float

    @property
    def total_s(self) -> float:
        return self.load_s + self.warmup_s


class RequestStream:
    """The caller's end of one request: an async iterator of `RequestOutput` pieces.

    Closing it (or abandoning the `generate` iterator) before the request finished cancels the
    request; the engine frees its KV blocks within one step.
    """

    def __init__(self, engine: Engine, request_id: str, prompt_tokens: int) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self._engine = engine
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self.finished = False

    def _deliver(self, item: RequestOutput | BaseException) -> None:
        """Called on the worker thread. A caller whose event loop is gone cannot read any more."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening
            self.finished = True
            self._engine.abort(self.request_id)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finish_reason is not None:
            self.finished = True
        return item

    def cancel(self) -> None:
        if not self.finished:
            self.finished = True
            self._engine.abort(self.request_id)


class _HookDispatch:
    """Bound hook methods per event, looked up once when hooks are added."""

    def __init__(self) -> None:
        self.hooks: list[Any] = []
        self.by_event: dict[str, list[Callable[..., None]]] = {event: [] for event in HOOK_EVENTS}

    def rebuild(self) -> None:
        self.by_event = {
            event: [getattr(h, event) for h in self.hooks if callable(getattr(h, event, None))]
            for event in HOOK_EVENTS
        }


class Engine:
    def __init__(
        self,
        model: LlamaForCausalLM,
        tokenizer: Tokenizer,
        model_config: ModelConfig,
        config: EngineConfig | None = None,
        name: str = "model",
        load_s: float = 0.0,
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
        self.cache = PagedKVCache(model_config, num_blocks, block_size, self.dtype, self.device)
        self.scheduler = Scheduler(
            self.cache.allocator,
            block_size,
            self.config.max_batch_size,
            max(self.config.max_prefill_tokens, self.max_model_len),
        )
        self._hooks = _HookDispatch()
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
        tokenizer = Tokenizer(directory, model_config.eos_token_ids)
        name = str(name_or_path) if str(name_or_path).startswith("bundled:") else directory.name
        return cls(
            model, tokenizer, model_config, config, name=name, load_s=time.perf_counter() - started
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
        if self.config.warmup:
            with torch.inference_mode():
                probe = Sequence(
                    request_id="warmup",
                    prompt_ids=[0] * min(8, self.max_model_len - 2),
                    params=SamplingParams(max_tokens=2, temperature=0),
                    priority=0,
                    arrival=-1,
                    detokenizer=IncrementalDetokenizer(self.tokenizer),
                    deliver=lambda _: None,
                )
                self.cache.ensure_capacity(probe.block_table, probe.num_tokens + 2)
                try:
                    logits = runner.prefill(self.model, self.cache, [probe])
                    probe.output_ids.append(int(logits[0].argmax()))
                    runner.decode(self.model, self.cache, [probe])
                    if self.device.type == "cuda":
                        torch.cuda.synchronize(self.device)
                finally:
                    self.cache.allocator.free(probe.block_table)
        self._warmup_s = time.perf_counter() - started

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
    ) -> RequestStream:
        """Queue a request now (raising EngineOverloaded or RequestTooLarge at once)."""
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
        """Run one request to the end; returns all its text and token ids in one output."""
        text: list[str] = []
        token_ids: list[int] = []
        last: RequestOutput | None = None
        async for output in self.generate(prompt, params, priority):
            text.append(output.text)
            token_ids.extend(output.token_ids)
            last = output
        assert last is not None
        return RequestOutput(
            last.request_id,
            "".join(text),
            tuple(token_ids),
            last.finish_reason,
            last.prompt_tokens,
            last.completion_tokens,
        )

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

    # ------------------------------------------------------------------------ worker side
    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._lock:
                while not (
                    self._stopping or self._incoming or self._aborted or self.scheduler.has_work()
                ):
                    self._lock.wait()
                if self._stopping:
                    return
                incoming, self._incoming = self._incoming, []
                aborted, self._aborted = self._aborted, set()
            try:
                with torch.inference_mode():
                    self._step(incoming, aborted)
            except Exception:  # a bug outside the forward pass must not kill the worker
                logger.exception("engine step failed outside the forward pass")

    def _step(self, incoming: list[Sequence], aborted: set[str]) -> None:
        started_ns = time.perf_counter_ns()
        by_event = self._hooks.by_event
        for sequence in incoming:
            self.scheduler.add(sequence)
        for request_id in aborted:
            sequence = self._sequences.get(request_id)
            if sequence is not None and sequence.finish_reason is None:
                self.scheduler.remove(sequence)
                self._finish(sequence, "cancelled", deliver=False)

        if self.config.step_delay_s > 0:
            time.sleep(self.config.step_delay_s)
        preempted = self.scheduler.reserve_decode_slots()
        decoding = list(self.scheduler.running)
        admitted = self.scheduler.admit()
        prefill_tokens = sum(s.num_tokens for s in admitted)

        if admitted:
            now = time.perf_counter_ns()
            for hook in by_event["on_schedule"]:
                for sequence in admitted:
                    hook(sequence.request_id, now)
            for hook in by_event["on_prefill_start"]:
                for sequence in admitted:
                    hook(sequence.request_id, now, sequence.num_tokens)
            logits = self._forward(runner.prefill, admitted)
            if logits is not None:
                now = time.perf_counter_ns()
                for hook in by_event["on_prefill_end"]:
                    for sequence in admitted:
                        hook(sequence.request_id, now)
                self._sample_and_emit(admitted, logits)

        if decoding:
            logits = self._forward(runner.decode, decoding)
            if logits is not None:
                self._sample_and_emit(decoding, logits)

        self._step_count += 1
        if by_event["on_step"]:
            finished_ns = time.perf_counter_ns()
            stats = StepStats(
                step=self._step_count,
                time_ns=finished_ns,
                step_time_s=(finished_ns - started_ns) / 1e9,
                batch_size=len(admitted) + len(decoding),
                prefill_tokens=prefill_tokens,
                decode_tokens=len(decoding),
                num_waiting=self.scheduler.num_waiting,
                num_running=len(self.scheduler.running),
                num_preempted=len(preempted),
                kv_blocks_total=self.cache.num_blocks,
                kv_blocks_free=self.cache.allocator.num_free,
                waiting_by_priority=self.scheduler.waiting_by_priority(),
            )
            for hook in by_event["on_step"]:
                hook(stats)

    def _forward(
        self,
        forward: Callable[[LlamaForCausalLM, PagedKVCache, list[Sequence]], torch.Tensor],
        sequences: list[Sequence],
    ) -> torch.Tensor | None:
        """Run a forward pass; on failure end just these sequences with an error."""
        try:
            if self.step_faults is not None:
                self.step_faults([s.request_id for s in sequences])
            return forward(self.model, self.cache, sequences)
        except Exception as error:
            ids = [s.request_id for s in sequences]
            logger.exception("forward pass failed for requests %s", ids)
            for sequence in sequences:
                self.scheduler.finish(sequence)
                self._finish(sequence, "error", deliver=False)
                sequence.deliver(
                    EngineStepFailed(f"the model failed on this request: {type(error).__name__}")
                )
            return None

    def _sample_and_emit(self, sequences: list[Sequence], logits: torch.Tensor) -> None:
        by_event = self._hooks.by_event
        greedy_ids = (
            logits.argmax(dim=-1).tolist() if any(s.params.greedy for s in sequences) else []
        )
        eos_ids = self.tokenizer.eos_token_ids
        for row, sequence in enumerate(sequences):
            params = sequence.params
            if params.greedy:
                token = int(greedy_ids[row])
            else:
                token = sample_token(
                    logits[row], params, sequence.generator or self._default_generator
                )
            sequence.output_ids.append(token)
            token_ns = time.perf_counter_ns()
            for hook in by_event["on_token"]:
                hook(sequence.request_id, token_ns, len(sequence.output_ids) - 1)

            finish_reason = None
            if token in eos_ids and not params.ignore_eos:
                finish_reason = "stop"
            elif len(sequence.output_ids) >= params.max_tokens:
                finish_reason = "length"
            final = finish_reason is not None
            text_ids = sequence.all_ids[:-1] if finish_reason == "stop" else sequence.all_ids
            sequence.text += sequence.detokenizer.step(text_ids, final=final)
            detok_ns = time.perf_counter_ns()
            for hook in by_event["on_detokenize"]:
                hook(sequence.request_id, detok_ns, detok_ns - token_ns)

            cut = stop_string_hit(sequence.text, params.stop) if params.stop else None
            if cut is not None:
                sequence.text = sequence.text[:cut]
                finish_reason = "stop"
            if finish_reason is None:
                safe = len(sequence.text) - held_back_length(sequence.text, params.stop)
            else:
                safe = len(sequence.text)
            delta = sequence.text[sequence.sent_chars : safe]
            sequence.sent_chars = max(sequence.sent_chars, safe)
            if finish_reason is not None:
                self.scheduler.finish(sequence)
                self._finish(sequence, finish_reason, deliver=False)
            sequence.deliver(
                RequestOutput(
                    request_id=sequence.request_id,
                    text=delta,
                    token_ids=(token,),
                    finish_reason=finish_reason,
                    prompt_tokens=len(sequence.prompt_ids),
                    completion_tokens=len(sequence.output_ids),
                )
            )

    def _finish(self, sequence: Sequence, reason: str, deliver: bool) -> None:
        sequence.finish_reason = reason
        with self._lock:
            self._sequences.pop(sequence.request_id, None)
        for hook in self._hooks.by_event["on_finish"]:
            hook(sequence.request_id, time.perf_counter_ns(), reason)
        if deliver:
            sequence.deliver(
                RequestOutput(
                    sequence.request_id,
                    "",
                    (),
                    reason,
                    len(sequence.prompt_ids),
                    len(sequence.output_ids),
                )
            )
