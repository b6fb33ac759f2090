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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo import mark_dynamic

from engine.model import AttentionBatch

Forward = Callable[..., torch.Tensor]


def compile_forward(forward: Forward, device: torch.device) -> Forward:
    """`forward` compiled by inductor with frozen weights; dynamic context length and batch."""
    options: dict[str, str | int | bool | Callable[..., Any]] = {"freezing": True}
    if device.type == "cpu":
        options["cpp_wrapper"] = True  # C++ calls into the kernels: less Python per step
    compiled = torch.compile(forward, dynamic=False, options=options)

    def run(
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        key_caches: list[torch.Tensor],
        value_caches: list[torch.Tensor],
        batch: AttentionBatch,
    ) -> torch.Tensor:
        mark_dynamic(batch.context_slots, 1)
        if input_ids.shape[0] > 1:
            for tensor in (input_ids, positions, batch.context_slots, batch.slot_mapping):
                mark_dynamic(tensor, 0)
            if batch.mask is not None:
                mark_dynamic(batch.mask, 0)
                mark_dynamic(batch.mask, 3)
        return compiled(input_ids, positions, key_caches, value_caches, batch)

    return run
