"""The worker side of the engine: one scheduler step after another on a background thread.

A step admits and prefills new sequences, then decodes the running ones (plainly, or
speculatively with a draft model), samples, checks stop conditions and streams the new text.
`Engine` inherits these methods; they touch nothing but the worker thread's state.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import torch

from engine import runner
from engine.config import EngineConfig
from engine.hooks import StepStats
from engine.kv_cache import PagedKVCache
from engine.model import LlamaForCausalLM
from engine.outputs import EngineStepFailed, RequestOutput
from engine.sampling import held_back_length, sample_token, stop_string_hit
from engine.scheduler import Scheduler, Sequence
from engine.speculative import SpeculativeDecoder
from engine.stream import EngineTotals, HookDispatch
from engine.tokenizer import Tokenizer

logger = logging.getLogger("engine")

_Result = TypeVar("_Result")


class EngineWorker:
    """Mixin holding the step loop; the attributes below are set by `Engine.__init__`."""

    config: EngineConfig
    model: LlamaForCausalLM
    tokenizer: Tokenizer
    cache: PagedKVCache
    scheduler: Scheduler
    speculative: SpeculativeDecoder | None
    device: torch.device
    totals: EngineTotals
    step_faults: Callable[[list[str]], None] | None
    _hooks: HookDispatch
    _lock: threading.Condition
    _incoming: list[Sequence]
    _aborted: set[str]
    _sequences: dict[str, Sequence]
    _stopping: bool
    _step_count: int
    _default_generator: torch.Generator

    @property
    def worker_threads(self) -> int:
        """Intra-op threads of the worker on a CPU (see `EngineConfig.cpu_threads`)."""
        return self.config.cpu_threads or max(1, (os.cpu_count() or 2) - 1)

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        # On a CPU the thread count is set again before every step: OpenMP's is per thread,
        # but MKL's (the matrix products) is process-wide, and any other thread calling
        # `torch.set_num_threads` (a warm-up restoring its own, a library) changes it under
        # us. Decode-sized products on more threads than the worker owns stall on each other
        # (a step takes half as long again). The call costs well under a microsecond.
        threads = self.worker_threads if self.device.type == "cpu" else 0
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
                if threads:
                    torch.set_num_threads(threads)
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
            gone = self._sequences.get(request_id)
            if gone is not None and gone.finish_reason is None:
                self.scheduler.remove(gone)
                self._finish(gone, "cancelled")

        if self.config.step_delay_s > 0:
            time.sleep(self.config.step_delay_s)
        preempted = self.scheduler.reserve_decode_slots()
        decoding = list(self.scheduler.running)
        admitted = self.scheduler.admit()
        prefill_tokens = sum(s.num_tokens - s.num_cached for s in admitted)
        caching = self.config.enable_prefix_caching
        queried = sum(s.num_tokens for s in admitted) if caching else 0
        hits = sum(s.prefix_hit_tokens for s in admitted) if caching else 0

        if admitted:
            now = time.perf_counter_ns()
            for hook in by_event["on_schedule"]:
                for sequence in admitted:
                    hook(sequence.request_id, now)
            for hook in by_event["on_prefix_hit"]:
                for sequence in admitted:
                    if sequence.prefix_hit_tokens:
                        hook(sequence.request_id, now, sequence.prefix_hit_tokens)
            for hook in by_event["on_prefill_start"]:
                for sequence in admitted:
                    hook(sequence.request_id, now, sequence.num_tokens - sequence.num_cached)
            logits = self._forward(self._prefill, admitted)
            if logits is not None:
                now = time.perf_counter_ns()
                for hook in by_event["on_prefill_end"]:
                    for sequence in admitted:
                        hook(sequence.request_id, now)
                self._register(admitted)
                self._sample_and_emit(admitted, logits)

        draft_tokens = accepted_tokens = 0
        decode_tokens = 0
        if decoding and self.speculative is not None:
            result = self._forward(self.speculative.step, decoding)
            if result is not None:
                self._register(decoding)
                draft_tokens, accepted_tokens = result.draft_tokens, result.accepted_tokens
                for sequence, tokens in zip(decoding, result.tokens, strict=True):
                    for token in tokens:
                        decode_tokens += 1
                        if self._emit(sequence, token):
                            break
        elif decoding:
            logits = self._forward(runner.decode, decoding)
            if logits is not None:
                self._register(decoding)
                self._sample_and_emit(decoding, logits)
                decode_tokens = len(decoding)
        totals = self.totals
        totals.prefill_tokens += prefill_tokens
        totals.decode_tokens += decode_tokens
        totals.prefix_cache_queried_tokens += queried
        totals.prefix_cache_hit_tokens += hits
        totals.spec_draft_tokens += draft_tokens
        totals.spec_accepted_tokens += accepted_tokens

        self._step_count += 1
        if by_event["on_step"]:
            finished_ns = time.perf_counter_ns()
            stats = StepStats(
                step=self._step_count,
                time_ns=finished_ns,
                step_time_s=(finished_ns - started_ns) / 1e9,
                batch_size=len(admitted) + len(decoding),
                prefill_tokens=prefill_tokens,
                decode_tokens=decode_tokens,
                num_waiting=self.scheduler.num_waiting,
                num_running=len(self.scheduler.running),
                num_preempted=len(preempted),
                kv_blocks_total=self.cache.num_blocks,
                kv_blocks_free=self.cache.allocator.num_free,
                waiting_by_priority=self.scheduler.waiting_by_priority(),
                prefix_cache_queried_tokens=queried,
                prefix_cache_hit_tokens=hits,
                spec_draft_tokens=draft_tokens,
                spec_accepted_tokens=accepted_tokens,
            )
            for hook in by_event["on_step"]:
                hook(stats)

    def _prefill(
        self, model: LlamaForCausalLM, cache: PagedKVCache, sequences: list[Sequence]
    ) -> torch.Tensor:
        logits = runner.prefill(model, cache, sequences)
        if self.speculative is not None:
            self.speculative.prefill(sequences)
        return logits

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
            ids = [s.request_id for s in sequences]
            logger.exception("forward pass failed for requests %s", ids)
            for sequence in sequences:
                self.scheduler.finish(sequence)
                self._finish(sequence, "error")
                sequence.deliver(
                    EngineStepFailed(f"the model failed on this request: {type(error).__name__}")
                )
            return None

    def _sample_and_emit(self, sequences: list[Sequence], logits: torch.Tensor) -> None:
        greedy_ids = (
            logits.argmax(dim=-1).tolist() if any(s.params.greedy for s in sequences) else []
        )
        for row, sequence in enumerate(sequences):
            params = sequence.params
            if params.greedy:
                token = int(greedy_ids[row])
            else:
                token = sample_token(
                    logits[row], params, sequence.generator or self._default_generator
                )
            self._emit(sequence, token)

    def _emit(self, sequence: Sequence, token: int) -> bool:
        """Append one token, run the stop checks, stream the new text; True if it finished."""
        by_event = self._hooks.by_event
        params = sequence.params
        eos_ids = self.tokenizer.eos_token_ids
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
        if finish_reason is None and not sequence.streaming and len(sequence.output_ids) > 1:
            return False  # not streaming: the first token and the end, nothing in between
        if finish_reason is None:
            safe = len(sequence.text) - held_back_length(sequence.text, params.stop)
        else:
            safe = len(sequence.text)
        delta = sequence.text[sequence.sent_chars : safe]
        sequence.sent_chars = max(sequence.sent_chars, safe)
        sent_tokens, sequence.sent_tokens = sequence.sent_tokens, len(sequence.output_ids)
        if finish_reason is not None:
            self.scheduler.finish(sequence)
            self._finish(sequence, finish_reason)
        sequence.deliver(
            RequestOutput(
                request_id=sequence.request_id,
                text=delta,
                token_ids=tuple(sequence.output_ids[sent_tokens:]),
                finish_reason=finish_reason,
                prompt_tokens=len(sequence.prompt_ids),
                completion_tokens=len(sequence.output_ids),
            )
        )
        return finish_reason is not None

    def _finish(self, sequence: Sequence, reason: str) -> None:
        """Mark a sequence finished and forget it; whoever calls this tells the caller."""
        sequence.finish_reason = reason
        with self._lock:
            self._sequences.pop(sequence.request_id, None)
        for hook in self._hooks.by_event["on_finish"]:
            hook(sequence.request_id, time.perf_counter_ns(), reason)
