"""The engine's front: loads a model, checks and submits requests, streams their results.

engine = Engine.from_pretrained("bundled:tiny")
await engine.start()
async for out in engine.generate("Hello", SamplingParams(max_tokens=16), priority=0):
    print(out.text, end="")

The scheduler, the KV cache and the step loop belong to `engine.worker` (`EngineWorker`).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from engine.config import CheckpointError, EngineConfig, ModelConfig
from engine.gpu import GpuReading, read_gpu_stats
from engine.loader import load_model, resolve_checkpoint, resolve_device, resolve_dtype
from engine.model import LlamaForCausalLM
from engine.outputs import ColdStart, EngineTotals, RequestOutput, RequestTooLarge
from engine.quantize import quantize_model
from engine.sampling import SamplingParams
from engine.sequence import Sequence
from engine.stream import RequestStream
from engine.tokenizer import IncrementalDetokenizer, Tokenizer
from engine.warmup import warm_up
from engine.worker import EngineWorker

__all__ = ["Engine"]


class Engine:
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
        self.worker = EngineWorker(
            model, tokenizer, model_config, self.config, self.max_model_len, draft
        )
        self._arrivals = itertools.count()
        # uuid4 reads the OS entropy pool per call (slow on some VMs): prefix + counter instead.
        self._id_prefix = os.urandom(6).hex()
        self._ids = itertools.count(1)
        self._load_s = load_s
        self._warmup_s: float | None = None

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
        model, model_config = load_model(directory, device, dtype, config.quantization)
        draft = None
        if config.draft_model is not None:
            draft_dir = resolve_checkpoint(config.draft_model)
            draft, draft_config = load_model(draft_dir, device, dtype, config.quantization)
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
        return self.worker.running

    @property
    def cold_start(self) -> ColdStart | None:
        """Load and warm-up time, once the engine has started."""
        if self._warmup_s is None:
            return None
        return ColdStart(load_s=self._load_s, warmup_s=self._warmup_s)

    @property
    def totals(self) -> EngineTotals:
        """Token counters since the engine was made (what `on_step` reports, summed)."""
        return self.worker.totals

    async def start(self) -> None:
        """Warm up (off the event loop) and start the worker thread."""
        if not self.worker.running:
            self._warmup_s = await asyncio.to_thread(warm_up, self.worker)
            self.worker.start()

    def start_sync(self) -> None:
        if not self.worker.running:
            self._warmup_s = warm_up(self.worker)
            self.worker.start()

    async def stop(self) -> None:
        await asyncio.to_thread(self.stop_sync)

    def stop_sync(self) -> None:
        """Stop the worker; requests still in the engine end with EngineStopped."""
        self.worker.stop()

    # ----------------------------------------------------------------------------- hooks
    def add_hooks(self, hooks: Any) -> None:
        """Register an object with any of the `EngineHooks` methods."""
        self.worker.add_hooks(hooks)

    def remove_hooks(self, hooks: Any) -> None:
        self.worker.remove_hooks(hooks)

    # ------------------------------------------------------------------------- requests
    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        return list(prompt)

    def check_fits(self, prompt_tokens: int, max_tokens: int) -> None:
        """The one check of a request's size (the API relies on it too): raise RequestTooLarge
        naming the parameter to change and by how much."""
        context = self.max_model_len
        if prompt_tokens == 0:
            raise RequestTooLarge(
                "the prompt is empty; send at least one token of text", "prompt", code=None
            )
        if prompt_tokens >= context:
            raise RequestTooLarge(
                f"the prompt has {prompt_tokens} tokens, the model's context is {context}; "
                f"shorten it to at most {context - 1} tokens",
                "prompt",
            )
        if max_tokens > self.max_tokens_cap:
            raise RequestTooLarge(
                f"max_tokens is {max_tokens}, above this server's cap of {self.max_tokens_cap}; "
                f"ask for at most {self.max_tokens_cap}",
                "max_tokens",
            )
        if prompt_tokens + max_tokens > context:
            raise RequestTooLarge(
                f"the prompt has {prompt_tokens} tokens and max_tokens is {max_tokens}, "
                f"together above the model's context of {context} tokens; shorten "
                f"the prompt or lower max_tokens to at most {context - prompt_tokens}",
                "max_tokens",
            )
        capacity = self.worker.kv_capacity_tokens
        if prompt_tokens + max_tokens > capacity:
            raise RequestTooLarge(
                f"prompt plus max_tokens ({prompt_tokens + max_tokens}) exceeds the KV cache "
                f"({capacity} tokens); lower max_tokens or raise num_kv_blocks",
                "max_tokens",
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
        if not self.worker.running:
            self.start_sync()
        prompt_ids = self.encode_prompt(prompt)
        self.check_fits(len(prompt_ids), params.max_tokens)
        request_id = request_id or f"req-{self._id_prefix}{next(self._ids):x}"
        stream = RequestStream(request_id, len(prompt_ids), self.worker.abort)
        generator = None
        if not params.greedy and params.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(params.seed)
        self.worker.enqueue(
            Sequence(
                request_id=request_id,
                prompt_ids=prompt_ids,
                params=params,
                priority=priority,
                arrival=next(self._arrivals),
                detokenizer=IncrementalDetokenizer.for_prompt(self.tokenizer, prompt_ids),
                deliver=stream.deliver,
                generator=generator,
                streaming=streaming,
            )
        )
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
        self.worker.abort(request_id)

    # --------------------------------------------------------------------------- status
    @property
    def num_free_blocks(self) -> int:
        return self.worker.cache.allocator.num_free

    @property
    def num_blocks(self) -> int:
        return self.worker.cache.num_blocks

    @property
    def num_active_requests(self) -> int:
        return self.worker.num_active_requests

    def scheduling_settings(self) -> dict[str, Any]:
        """The limits and policy the scheduler runs under (shown in /health and /v1/models)."""
        config, scheduler = self.config, self.worker.scheduler
        return {
            "policy": config.scheduling,
            # Why this policy runs (the spec's objectives, a flag) and what it promises.
            "policy_reason": config.scheduling_reason
            or "EngineConfig.scheduling (the engine's default when no spec chooses)",
            "policy_promise": scheduler.policy.promise,
            "max_batch_size": scheduler.max_batch_size,
            "max_num_batched_tokens": scheduler.max_num_batched_tokens,
            "max_model_len": self.max_model_len,
            "kv_cache_blocks": self.worker.cache.num_blocks,
            "kv_cache_tokens": self.worker.kv_capacity_tokens,
            "priority_aging_s": config.priority_aging_s,
        }

    def gpu_stats(self) -> GpuReading:
        """This process's GPUs through NVML, and its failed calls so far (`engine.gpu`)."""
        return read_gpu_stats()

    async def wait_idle(self, timeout_s: float = 10.0) -> None:
        """Wait until no request is in the engine (tests, graceful shutdown)."""
        deadline = time.monotonic() + timeout_s
        while self.num_active_requests:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.num_active_requests} requests still in the engine")
            await asyncio.sleep(0.005)
