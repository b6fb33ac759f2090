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

A weight format whose kernel inductor cannot trace (a build without a lowering for it) is not
fatal: the first failed compile is logged with its reason, kept in `CompiledForward.fallback`,
and every step from then on runs the eager forward (same outputs, no compile speed-up).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo import mark_dynamic
from torch._dynamo.exc import TorchDynamoException

from engine.model import AttentionBatch

Forward = Callable[..., torch.Tensor]
logger = logging.getLogger(__name__)


class CompiledForward:
    """The compiled decode forward, or the eager one after a compile that failed."""

    def __init__(self, forward: Forward, device: torch.device) -> None:
        options: dict[str, str | int | bool | Callable[..., Any]] = {"freezing": True}
        if device.type == "cpu":
            options["cpp_wrapper"] = True  # C++ calls into the kernels: less Python per step
        self.eager = forward
        self.compiled: Forward = torch.compile(forward, dynamic=False, options=options)
        # Why the forward runs eagerly (the compile error, one line), or None while compiled.
        self.fallback: str | None = None

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        key_caches: list[torch.Tensor],
        value_caches: list[torch.Tensor],
        batch: AttentionBatch,
    ) -> torch.Tensor:
        if self.fallback is not None:
            return self.eager(input_ids, positions, key_caches, value_caches, batch)
        mark_dynamic(batch.context_slots, 1)
        if input_ids.shape[0] > 1:
            for tensor in (input_ids, positions, batch.context_slots, batch.slot_mapping):
                mark_dynamic(tensor, 0)
            if batch.mask is not None:
                mark_dynamic(batch.mask, 0)
                mark_dynamic(batch.mask, 3)
        try:
            return self.compiled(input_ids, positions, key_caches, value_caches, batch)
        except TorchDynamoException as error:
            # Raised while tracing or compiling, before any kernel ran: the caches are intact.
            self.fallback = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
            logger.warning(
                "the decode forward could not be compiled (%s); it runs eagerly", self.fallback
            )
            return self.eager(input_ids, positions, key_caches, value_caches, batch)


def compile_forward(forward: Forward, device: torch.device) -> CompiledForward:
    """`forward` compiled by inductor with frozen weights; dynamic context length and batch."""
    return CompiledForward(forward, device)
