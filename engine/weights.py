"""Weight formats for the decoder's matrix products: fewer bytes read per generated token.

A decode step on a model that does not fit in the CPU's caches is bound by memory: every
weight is read once per token. Each format here trades bytes for a kernel that reads them:

- `Tensor`: float32 (or float16/bfloat16 on CUDA), through `torch.mm`/`addmm`.
- `MkldnnWeight`: bfloat16 on a CPU with bf16 instructions, prepacked once into oneDNN's
  blocked layout (`torch.ops.mkldnn._linear_pointwise`). A plain bf16 `torch.mm` on a CPU is
  no faster than float32 (it converts per call); the prepacked product reads half the bytes.
- `Int8Weight` (quantize.py): int8 per output channel, `aten._weight_int8pack_mm`.
- `Int4Weight` (quantize.py): int4 in groups along the input, `aten._weight_int4pack_mm*`.

`linear` and `linear_add` dispatch on the type; the forward pass never looks at the format.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@functools.cache
def cpu_has_bf16_kernels() -> bool:
    """True when oneDNN runs bfloat16 natively here (AVX512-BF16 or AMX): prepacking pays."""
    return bool(
        torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


@dataclass(frozen=True)
class MkldnnWeight:
    """An [out, in] bfloat16 weight in oneDNN's blocked layout (an opaque mkldnn tensor)."""

    packed: torch.Tensor
    out_features: int
    nbytes: int

    @classmethod
    def pack(cls, weight: torch.Tensor) -> MkldnnWeight:
        weight = weight.detach().to(torch.bfloat16).contiguous()
        # Batch size 1 is the hint oneDNN picks its layout for: decode steps dominate.
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        return cls(packed=packed, out_features=weight.shape[0], nbytes=weight.nbytes)


# Below this many elements oneDNN's per-call cost (~70 us here) outweighs the bytes it saves,
# and a plain bf16 `torch.mm` is slower still: such matrices are multiplied in float32.
ONEDNN_MIN_ELEMENTS = 1 << 20


def repacks(weight: torch.Tensor) -> bool:
    """Whether `pack_full_precision` stores this weight in another form (bf16 on a CPU)."""
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16


def pack_full_precision(weight: torch.Tensor) -> torch.Tensor | MkldnnWeight:
    """The fastest full-precision form of an [out, in] weight for its device and dtype.

    On a CPU: a large bfloat16 matrix goes to oneDNN when the processor has bf16 instructions,
    a small one (or any without them) to float32; float32 is stored input-major (the transpose
    `torch.mm` reads is then contiguous: a one-row product reads the matrix in order, about
    twice as fast once it is out of the core's cache).
    """
    weight = weight.detach()
    if weight.device.type != "cpu":
        return weight.contiguous()
    if repacks(weight):
        if weight.numel() >= ONEDNN_MIN_ELEMENTS and cpu_has_bf16_kernels():
            return MkldnnWeight.pack(weight)
        weight = weight.float()
    if weight.dtype == torch.float32:
        return weight.t().contiguous().t()
    return weight.contiguous()


def linear_full(
    x: torch.Tensor, weight: torch.Tensor | MkldnnWeight, bias: torch.Tensor | None
) -> torch.Tensor:
    """`F.linear` for the full-precision formats."""
    if isinstance(weight, MkldnnWeight):
        return torch.ops.mkldnn._linear_pointwise(x, weight.packed, bias, "none", [], "")
    if weight.dtype != x.dtype:  # a small bf16 matrix kept in float32 (see above)
        out = linear_full(x.to(weight.dtype), weight, None if bias is None else bias.float())
        return out.to(x.dtype)
    if bias is None and x.dim() == 2:
        return torch.mm(x, weight.t())  # what F.linear ends in, minus three dispatches
    return F.linear(x, weight, bias)


def linear_add_full(
    residual: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | MkldnnWeight,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """`residual + F.linear(x, weight, bias)` in one kernel where one exists."""
    if isinstance(weight, MkldnnWeight):
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, weight.packed, bias, "add")
    if weight.dtype != x.dtype:
        return residual + linear_full(x, weight, bias)
    if bias is None:
        return torch.addmm(residual, x, weight.t())
    return torch.addmm(residual + bias, x, weight.t())
