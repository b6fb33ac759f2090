"""The engine's worker: a thread that owns scheduler, KV cache and queues, and runs the steps.

A step asks the scheduler for a plan (decodes first, prefill chunks in the policy's order under
the token budget, preemptions, requests shed), runs the prefill chunks and the decodes (plainly,
or speculatively with a draft model), samples, checks stop conditions and streams the new text.
Other threads reach it only through `enqueue`, `abort`, the hook methods and `stop`, all under
`_lock`, the one lock shared with the step loop."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

import engine.runner as runner
import engine.step_hooks as step_hooks
from engine.chunked import chunk_forward
from engine.config import EngineConfig, ModelConfig
from engine.emit import next_output
from engine.fused import fused_forward
from engine.hooks import HookDispatch
from engine.kv_cache import PagedKVCache, blocks_needed
from engine.model import LlamaForCausalLM
from engine.outputs import (
    EngineOverloaded,
    EngineStepFailed,
    EngineStopped,
    EngineTotals,
    RequestShed,
)
from engine.policies import SHED_QUEUE_FULL
from engine.sampling import refuse_under_speculation, sample_rows
from engine.scheduler import Scheduler, StepPlan
from engine.sequence import Sequence
from engine.speculative import SpeculativeDecoder
from engine.tokenizer import Tokenizer

logger = logging.getLogger("engine")

_Result = TypeVar("_Result")


class EngineWorker:
    """The scheduler, the KV cache(s), the queues between callers and the step loop's thread."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        tokenizer: Tokenizer,
        model_config: ModelConfig,
        config: EngineConfig,
        max_model_len: int,
        draft: LlamaForCausalLM | None = None,
    ) -> None:
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self._eos_ids = tokenizer.eos_token_ids  # read once per token: bound here
        self.device = next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        block_size = config.block_size
        num_blocks = config.num_kv_blocks or max(
            blocks_needed(max_model_len, block_size),
            config.kv_cache_bytes // PagedKVCache.bytes_per_block(model_config, block_size, dtype),
        )
        self.cache = PagedKVCache(
            model_config,
            num_blocks,
            block_size,
            dtype,
            self.device,
            enable_caching=config.enable_prefix_caching,
        )
        self.scheduler = Scheduler.from_config(
            config,
            self.cache.allocator,
            num_speculative=config.num_speculative_tokens if draft is not None else 0,
        )
        self._default_generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self.speculative: SpeculativeDecoder | None = None
        if draft is not None:
            # Same block ids as the target's cache, so prefix-cached blocks hold both.
            draft_cache = PagedKVCache(draft.config, num_blocks, block_size, dtype, self.device)
            self.speculative = SpeculativeDecoder(
                draft, draft_cache, config.num_speculative_tokens, self._default_generator
            )
        self.totals = EngineTotals()
        self.hooks = HookDispatch()
        self._lock = threading.Condition()
        # Test hook: called with a batch's request ids before its forward; raise to fail it.
        self.step_faults: Callable[[list[str]], None] | None = None
        # Shared with callers, under `_lock`: handed over at the start of each step.
        self._incoming: list[Sequence] = []
        self._aborted: set[str] = set()
        self._shed_at_submit: list[tuple[int, str]] = []  # (priority, reason), for on_step
        self._sequences: dict[str, Sequence] = {}  # every request not finished yet, by id
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._step_count = 0

    # ---------------------------------------------------------------- callers' surface
    @property
    def threads(self) -> int:
        """Intra-op threads of the worker on a CPU (see `EngineConfig.cpu_threads`)."""
        return self.config.cpu_threads or max(1, (os.cpu_count() or 2) - 1)

    @property
    def running(self) -> bool:
        return self._thread is not None

    @property
    def num_active_requests(self) -> int:
        with self._lock:
            return len(self._sequences)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.cache.num_blocks * self.cache.block_size

    def start(self) -> None:
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="engine-worker", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread; requests still in the engine end with EngineStopped."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        for sequence in self.scheduler.all_sequences() + self._incoming:
            self.scheduler.remove(sequence)
            sequence.deliver(EngineStopped("the engine was stopped"))
        self._incoming.clear()
        self._sequences.clear()

    def enqueue(self, sequence: Sequence) -> None:
        """Hand a new request to the step loop, or raise EngineStopped / EngineOverloaded."""
        request_id = sequence.request_id
        if self.speculative is not None:
            refuse_under_speculation(sequence.params)
        with self._lock:
            if self._stopping:
                raise EngineStopped("the engine is stopping; retry against another replica")
            waiting = len(self._incoming) + self.scheduler.num_waiting
            if waiting >= self.config.max_waiting:
                self._shed_at_submit.append((sequence.priority, SHED_QUEUE_FULL))
                raise EngineOverloaded(
                    f"{waiting} requests are already waiting (limit {self.config.max_waiting}); "
                    "retry shortly",
                    retry_after_s=1.0,
                )
            if request_id in self._sequences:
                raise ValueError(f"request id '{request_id}' is already in use")
            self._sequences[request_id] = sequence
            sequence.arrival_ns = sequence.queued_ns = time.perf_counter_ns()
            for hook in self.hooks.by_event["on_enqueue"]:
                hook(request_id, sequence.arrival_ns, len(sequence.prompt_ids), sequence.priority)
            self._incoming.append(sequence)
            self._lock.notify()

    def abort(self, request_id: str) -> None:
        """Cancel a request from any thread; its blocks are freed at the start of the next step."""
        with self._lock:
            if request_id in self._sequences:
                self._aborted.add(request_id)
                self._lock.notify()

    def add_hooks(self, hooks: Any) -> None:
        with self._lock:
            self.hooks.add(hooks)

    def remove_hooks(self, hooks: Any) -> None:
        with self._lock:
            self.hooks.remove(hooks)

    # ------------------------------------------------------------------ the step loop
    def _run(self) -> None:
        torch.set_grad_enabled(False)
        # On a CPU the thread count is set again before every step (under a microsecond): MKL's
        # is process-wide and any thread's `torch.set_num_threads` changes it under us; decode
        # products on more threads than the worker owns stall each other (steps 1.5x longer).
        threads = self.threads if self.device.type == "cpu" else 0
        lock = self._lock
        scheduler = self.scheduler
        while True:
            with lock:
                while not (
                    self._stopping or self._incoming or self._aborted or scheduler.has_work()
                ):
                    lock.wait()
                if self._stopping:
                    return
                incoming, self._incoming = self._incoming, []
                aborted, self._aborted = self._aborted, set()
                shed, self._shed_at_submit = self._shed_at_submit, []
            try:
                if threads:
                    torch.set_num_threads(threads)
                with torch.inference_mode():
                    self._step(incoming, aborted, shed)
            except Exception:  # a bug outside the forward pass must not kill the worker
                logger.exception("engine step failed outside the forward pass")

    def _step(
        self, incoming: list[Sequence], aborted: set[str], shed: list[tuple[int, str]]
    ) -> None:
        started_ns = time.perf_counter_ns()
        by_event = self.hooks.by_event
        for sequence in incoming:
            self.scheduler.add(sequence)
        for request_id in aborted:
            gone = self._sequences.get(request_id)
            if gone is not None and gone.finish_reason is None:
                self.scheduler.remove(gone)
                self._finish(gone, "cancelled")

        if self.config.step_delay_s > 0:
            time.sleep(self.config.step_delay_s)
        plan = self.scheduler.schedule(time.perf_counter_ns(), started_ns)
        self._refuse(plan, shed)
        prefix_tokens = (0, 0)
        if plan.admitted:  # scheduled at the plan instant, where their blame cuts the wait
            step_hooks.announce_admitted(by_event, plan.admitted, plan.planned_ns)
            if self.config.enable_prefix_caching:
                prefix_tokens = step_hooks.prefix_lookups(plan.admitted)
        decoding = plan.decodes
        decode_tokens, speculative_tokens = self._run_plan(plan)
        step_hooks.add_to_totals(
            self.totals, plan, decode_tokens, prefix_tokens, speculative_tokens
        )

        self._step_count += 1
        finished_ns = time.perf_counter_ns()
        self.scheduler.step_finished(plan, (finished_ns - started_ns) / 1e9, finished_ns)
        if by_event["on_step"]:
            stats = step_hooks.step_stats(
                self._step_count,
                started_ns,
                finished_ns,
                plan,
                decoding,
                self.scheduler,
                self.cache,
                decode_tokens=decode_tokens,
                prefix_tokens=prefix_tokens,
                speculative_tokens=speculative_tokens,
                shed=shed,
            )
            for hook in by_event["on_step"]:
                hook(stats)

    def _refuse(self, plan: StepPlan, shed: list[tuple[int, str]]) -> None:
        """End the requests the scheduler shed with a RequestShed; count them in `shed`."""
        for sequence, reason in plan.shed:
            shed.append((sequence.priority, reason))
            self._finish(sequence, "shed")
            sequence.deliver(
                RequestShed(
                    f"this request can no longer meet its tier's TTFT objective ({reason}): "
                    f"{self.scheduler.num_waiting} requests are waiting ahead of or beside it; "
                    "retry shortly",
                    reason,
                )
            )

    def _run_plan(self, plan: StepPlan) -> tuple[int, tuple[int, int]]:
        """The step's forward passes: the decodes and the prefill chunks in one
        (engine/fused.py), unless a draft model speculates or `EngineConfig.fuse_steps` is
        off; else the chunks, then the decodes. Returns the tokens decoded and (drafted,
        accepted). First tokens of completed prompts are emitted before the decodes'."""
        decoding, chunked = plan.decodes, self._start_prefill(plan)
        if chunked and decoding and self.speculative is None and self.config.fuse_steps:
            fused = self._forward(fused_forward(plan.chunks), decoding + chunked)
            self._finish_prefill(plan, None if fused is None else fused[1])
            return (0 if fused is None else self._emit_decodes(decoding, fused[0])), (0, 0)
        if chunked:
            forward = chunk_forward([count for _, count in plan.chunks], self.speculative)
            self._finish_prefill(plan, self._forward(forward, chunked))
        if not decoding:
            return 0, (0, 0)
        if self.speculative is None:
            logits = self._forward(runner.decode, decoding)
            return (0 if logits is None else self._emit_decodes(decoding, logits)), (0, 0)
        result = self._forward(self.speculative.step, decoding)
        if result is None:
            return 0, (0, 0)
        self._register(decoding)
        decode_tokens = 0
        for sequence, tokens in zip(decoding, result.tokens, strict=True):
            for token in tokens:
                decode_tokens += 1
                if self._emit(sequence, token):
                    break
        return decode_tokens, (result.draft_tokens, result.accepted_tokens)

    def _emit_decodes(self, decoding: list[Sequence], logits: torch.Tensor) -> int:
        self._register(decoding)
        self._sample_and_emit(decoding, logits)
        return len(decoding)

    def _start_prefill(self, plan: StepPlan) -> list[Sequence]:
        chunked = [sequence for sequence, _ in plan.chunks]
        if chunked:
            step_hooks.announce_prefill_start(self.hooks.by_event, chunked)
        for sequence in chunked:
            sequence.prefill_started = True
        return chunked

    def _finish_prefill(self, plan: StepPlan, logits: torch.Tensor | None) -> None:
        """After the chunks' forward: announce the prompts completed and sample their first
        token (`logits`: one row per chunk; None: the forward failed)."""
        if logits is None:
            return
        sequences = [sequence for sequence, _ in plan.chunks]
        done = [row for row, s in enumerate(sequences) if s.num_cached == s.num_tokens]
        completed = [sequences[row] for row in done]
        step_hooks.announce_prefill_end(self.hooks.by_event, completed)
        self._register(sequences)
        for sequence in completed:
            sequence.prefilled = True
        if completed:
            rows = logits if len(done) == len(sequences) else logits[done]
            self._sample_and_emit(completed, rows)

    def _register(self, sequences: list[Sequence]) -> None:
        """Offer blocks completed by this forward to the prefix cache, before any finishing
        sequence gives its blocks back (so a request that ends still leaves its prefix)."""
        if not self.config.enable_prefix_caching:
            return
        for sequence in sequences:
            if sequence.block_table:
                valid = sequence.num_cached
                if self.speculative is not None:
                    valid = min(valid, sequence.draft_cached)  # both caches must hold it
                self.scheduler.register_computed(sequence, valid)

    def _forward(
        self,
        forward: Callable[[LlamaForCausalLM, PagedKVCache, list[Sequence]], _Result],
        sequences: list[Sequence],
    ) -> _Result | None:
        """Run a forward pass; on failure end just these sequences with an error."""
        try:
            if self.step_faults is not None:
                self.step_faults([s.request_id for s in sequences])
            return forward(self.model, self.cache, sequences)
        except Exception as error:
            return self._fail(sequences, "forward pass", error)

    def _fail(self, sequences: list[Sequence], stage: str, error: Exception) -> None:
        """End these sequences with an error, out of the batch: no later step inherits them."""
        logger.exception("%s failed for requests %s", stage, [s.request_id for s in sequences])
        failed = EngineStepFailed(f"the model failed on this request: {type(error).__name__}")
        for sequence in sequences:
            self.scheduler.finish(sequence)
            self._finish(sequence, "error")
            sequence.deliver(failed)

    def _sample_and_emit(self, sequences: list[Sequence], logits: torch.Tensor) -> None:
        generators = [s.generator or self._default_generator for s in sequences]
        params, generated = [s.params for s in sequences], [s.output_ids for s in sequences]
        for sequence, token in zip(
            sequences, sample_rows(logits, params, generated, generators), strict=True
        ):
            if isinstance(token, Exception):
                self._fail([sequence], "sampling", token)
            else:
                self._emit(sequence, token)

    def _emit(self, sequence: Sequence, token: int) -> bool:
        """Append one token and stream what is due; True if it finished the request."""
        output = next_output(sequence, token, self._eos_ids, self.hooks.by_event)
        if output is None:
            return False
        reason = output.finish_reason
        if reason is not None:
            # Finished (blocks back, on_finish) before the caller hears of it.
            self.scheduler.finish(sequence)
            self._finish(sequence, reason)
        sequence.deliver(output)
        return reason is not None

    def _finish(self, sequence: Sequence, reason: str) -> None:
        """Mark it finished and forget it (on_blame, on_finish); whoever calls this delivers."""
        sequence.finish_reason = reason
        with self._lock:
            self._sequences.pop(sequence.request_id, None)
        now = time.perf_counter_ns()
        blame = self.scheduler.close_blame(sequence, now)
        step_hooks.announce_finish(self.hooks.by_event, sequence.request_id, now, reason, blame)
