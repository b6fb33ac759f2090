"""INT8 weight-only quantization of the linear layers (as in gpt-fast's `quantize.py`).

Each weight matrix is stored as int8 with one float scale per output channel (row):
`w ~= q * scale[:, None]`, `scale = max|w_row| / 127`. Activations stay in the model's dtype;
the matmul dequantizes on the fly, `F.linear(x, q.to(x.dtype)) * scale`, which works on CPU
and CUDA alike. It cuts weight memory to a quarter of float32 (half of bfloat16); whether it
also cuts decode time depends on the matmul being bound by reading weights (large models on
GPUs) rather than by per-op overhead (the small bundled models on a CPU).

Embeddings and norms stay in full precision: they are small and quality-sensitive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from engine.model import LlamaForCausalLM


@dataclass(frozen=True)
class Int8Weight:
    """A quantized [out, in] weight: int8 values and per-output-channel scales."""

    qweight: torch.Tensor  # int8 [out, in]
    scales: torch.Tensor  # [out], in the activations' dtype

    @classmethod
    def quantize(cls, weight: torch.Tensor | Int8Weight) -> Int8Weight:
        if isinstance(weight, Int8Weight):  # quantizing twice would only lose precision
            return weight
        w = weight.detach().float()
        scales = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
        qweight = torch.clamp(torch.round(w / scales[:, None]), -127, 127).to(torch.int8)
        return cls(qweight=qweight, scales=scales.to(weight.dtype))

    def dequantize(self) -> torch.Tensor:
        return self.qweight.to(self.scales.dtype) * self.scales[:, None]

    @property
    def nbytes(self) -> int:
        return self.qweight.nbytes + self.scales.nbytes


Weight = torch.Tensor | Int8Weight


def linear(x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear` for full-precision or int8 weights."""
    if isinstance(weight, Int8Weight):
        out = F.linear(x, weight.qweight.to(x.dtype)) * weight.scales
        return out if bias is None else out + bias
    if bias is None and x.dim() == 2:
        return torch.mm(x, weight.t())  # what F.linear ends in, minus three dispatches
    return F.linear(x, weight, bias)


def linear_add(
    residual: torch.Tensor, x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`residual + linear(x, weight, bias)` for 2-D `residual` and `x`; one `addmm` when it can."""
    if bias is None and isinstance(weight, torch.Tensor):
        return torch.addmm(residual, x, weight.t())
    return residual + linear(x, weight, bias)


def quantize_model(model: LlamaForCausalLM) -> None:
    """Replace the fused linear weights and the LM head of a loaded model with int8 ones."""
    for layer in model.fused:
        layer.qkv_weight = Int8Weight.quantize(layer.qkv_weight)
        layer.o_weight = Int8Weight.quantize(layer.o_weight)
        layer.gate_up_weight = Int8Weight.quantize(layer.gate_up_weight)
        layer.down_weight = Int8Weight.quantize(layer.down_weight)
    model.lm_head_weight = Int8Weight.quantize(model.lm_head.weight)


def linear_weight_bytes(model: LlamaForCausalLM) -> int:
    """Bytes held by the weights the forward pass multiplies with (fused layers + LM head)."""
    total = 0
    for layer in model.fused:
        for weight in (layer.qkv_weight, layer.o_weight, layer.gate_up_weight, layer.down_weight):
            total += weight.nbytes
    head = model.lm_head_weight
    return total + head.nbytes
