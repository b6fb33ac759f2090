"""Opt-in `torch.compile` of the decode forward (`EngineConfig(compile=True)`, `--compile`).

A decode step at small batch sizes is mostly per-op overhead: a hundred small kernels
(norms, RoPE, residual adds, SwiGLU) around a few matrix-vector products. Inductor fuses
those into a handful of generated kernels. Only the decode forward is compiled: it runs
every step, while prefill runs once per request and has far more shapes.

One graph serves a single sequence: static batch size, dynamic context length (it grows every
step), so each call checks few guards. Larger batches share a second graph, dynamic in the
batch size too. `warm_up` builds
both before the engine takes traffic. Weights are frozen into the graph (inductor
`freezing`), so a compiled forward belongs to the weights it was built from: `fuse()` drops
it when weights change.

A single sequence's step skips TorchDynamo's guards (vLLM's custom dispatcher does the same):
once its graph is built, the bytecode Dynamo generated for it is called directly, and
`_single_fits` checks the few facts that graph was built for. At a few million parameters
the guards cost a third of what the generated kernels do. Each `CompiledForward` compiles
its own copy of the forward's code, so engines in one process never share (and never walk)
each other's cache entries, nor exhaust Dynamo's recompile limit.

A weight format whose kernel inductor cannot trace (a build without a lowering for it) is not
fatal: the first failed compile is logged with its reason, kept in `CompiledForward.fallback`,
and every step from then on runs the eager forward (same outputs, no compile speed-up).
"""

from __future__ import annotations

import logging
import threading
import types
from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo import convert_frame, mark_dynamic
from torch._dynamo.exc import TorchDynamoException

from engine.attention import AttentionBatch

Forward = Callable[..., torch.Tensor]
logger = logging.getLogger(__name__)


def _own_code(forward: Forward) -> Forward:
    """`forward` (a bound method) over a fresh copy of its code object.

    Dynamo keeps compiled entries per code object: a copy gives this compiled forward its own.
    """
    if not isinstance(forward, types.MethodType):
        return forward
    function = forward.__func__
    copy = types.FunctionType(
        function.__code__.replace(),
        function.__globals__,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )
    copy.__kwdefaults__ = function.__kwdefaults__
    return types.MethodType(copy, forward.__self__)


class _SingleCapture:
    """Catches the bytecode Dynamo generates for one compile of `code` on this thread."""

    def __init__(self, code: types.CodeType) -> None:
        self.code = code
        self.thread = threading.get_ident()
        self.generated: list[types.CodeType] = []
        self.other = False  # Dynamo generated code for another frame too (a graph break)

    def __call__(self, code: types.CodeType, new_code: types.CodeType) -> types.CodeType | None:
        if threading.get_ident() == self.thread:
            if code is self.code:
                self.generated.append(new_code)
            else:
                self.other = True
        return None  # Dynamo keeps the code it generated


class CompiledForward:
    """The compiled decode forward, or the eager one after a compile that failed."""

    def __init__(self, forward: Forward, device: torch.device, max_context: int) -> None:
        options: dict[str, str | int | bool | Callable[..., Any]] = {"freezing": True}
        if device.type == "cpu":
            options["cpp_wrapper"] = True  # C++ calls into the kernels: less Python per step
        self.eager = forward
        self._own = _own_code(forward)
        self.compiled: Forward = torch.compile(self._own, dynamic=False, options=options)
        # Why the forward runs eagerly (the compile error, one line), or None while compiled.
        self.fallback: str | None = None
        # The single-sequence graph called without guards, once built; see `_single_fits`.
        self.single: Forward | None = None
        self._max_context = max_context
        self._grad_mode = (False, False)  # (grad enabled, inference mode) it was built under
        self._single_tried = False  # one capture only: a hook per step would cost every step
        # The KV cache's shape the single graph was built for (its shapes are static): another
        # engine sharing this model has its own cache, maybe sized otherwise.
        self._cache_shape: torch.Size | None = None

    def _single_fits(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch
    ) -> bool:
        """Whether this call is one the single-sequence graph was built for: one sequence, one
        token, no mask or padding, a context Dynamo did not specialize (2 or more keys) that
        the RoPE table covers, the same grad mode, the dense layouts the cache hands out."""
        context = batch.context_slots.shape[1]
        return (
            input_ids.shape == (1, 1)
            and batch.mask is None
            and batch.token_index is None
            and 2 <= context <= self._max_context
            and (torch.is_grad_enabled(), torch.is_inference_mode_enabled()) == self._grad_mode
            and batch.context_slots.is_contiguous()
            and positions.is_contiguous()
        )

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        key_caches: list[torch.Tensor],
        value_caches: list[torch.Tensor],
        batch: AttentionBatch,
    ) -> torch.Tensor:
        if (
            self.single is not None
            and key_caches[0].shape == self._cache_shape
            and self._single_fits(input_ids, positions, batch)
        ):
            return self.single(input_ids, positions, key_caches, value_caches, batch)
        if self.fallback is not None:
            return self.eager(input_ids, positions, key_caches, value_caches, batch)
        mark_dynamic(batch.context_slots, 1)
        capture: _SingleCapture | None = None
        if input_ids.shape[0] > 1:
            for tensor in (input_ids, positions, batch.context_slots, batch.slot_mapping):
                mark_dynamic(tensor, 0)
            if batch.mask is not None:
                mark_dynamic(batch.mask, 0)
                mark_dynamic(batch.mask, 3)
        elif not self._single_tried and isinstance(self._own, types.MethodType):
            self._single_tried = True
            capture = _SingleCapture(self._own.__func__.__code__)
        try:
            if capture is None:
                return self.compiled(input_ids, positions, key_caches, value_caches, batch)
            handle = convert_frame.register_bytecode_hook(capture)
            try:
                out = self.compiled(input_ids, positions, key_caches, value_caches, batch)
            finally:
                handle.remove()
        except TorchDynamoException as error:
            # Raised while tracing or compiling, before any kernel ran: the caches are intact.
            self.fallback = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
            logger.warning(
                "the decode forward could not be compiled (%s); it runs eagerly", self.fallback
            )
            return self.eager(input_ids, positions, key_caches, value_caches, batch)
        self._adopt_single(capture, input_ids, positions, key_caches[0], batch)
        return out

    def _adopt_single(
        self,
        capture: _SingleCapture | None,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        key_cache: torch.Tensor,
        batch: AttentionBatch,
    ) -> None:
        """Keep the bytecode of a single-sequence compile if it is one whole graph."""
        if capture is None or capture.other or len(capture.generated) != 1:
            return  # nothing compiled (already cached), or a graph break: keep the guards
        generated = capture.generated[0]
        # Side effects Dynamo replays in Python (torch builds without the query: assume some).
        has_side_effects = getattr(convert_frame, "compiled_code_has_side_effects", None)
        if generated.co_freevars or has_side_effects is None or has_side_effects(generated):
            return
        self._grad_mode = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        if not self._single_fits(input_ids, positions, batch):
            return
        assert isinstance(self._own, types.MethodType)
        function = self._own.__func__
        # The module's globals as they are now, Dynamo's `__compiled_fn_*` for this graph
        # among them: a later compile that reused a name (older torch numbers them from 1
        # again after `torch._dynamo.reset()`) cannot rebind this step's graph.
        direct = types.FunctionType(
            generated, dict(function.__globals__), function.__name__, function.__defaults__
        )
        self.single = types.MethodType(direct, self._own.__self__)
        self._cache_shape = key_cache.shape


def compile_forward(forward: Forward, device: torch.device, max_context: int) -> CompiledForward:
    """`forward` compiled by inductor with frozen weights; dynamic context length and batch.

    `max_context`: the longest context the guard-free single-sequence step may serve: one the
    RoPE table covers and, with a sliding window, no longer than the window (beyond it the
    forward takes a masking branch the graph built at a short context does not have)."""
    return CompiledForward(forward, device, max_context)
