"""Weight-only quantization of the linear layers with real low-bit kernels (as in gpt-fast).

- int8: one scale per output channel (row), `w ~= q * scale[:, None]`, `scale = max|w_row|/127`;
  the product is `aten._weight_int8pack_mm` (int8 weights read as they are, scaled after).
- int4: groups of `INT4_GROUP` inputs per row, asymmetric (scale and zero per group, gpt-fast's
  `get_group_qparams`); the product is `aten._weight_int4pack_mm_for_cpu` on a CPU and
  `aten._weight_int4pack_mm` on CUDA.

On a CPU both kernels are fast with bfloat16 activations only (float32 ones take a scalar path
ten times slower), so a float32 model's activations cross into bfloat16 for the product and
back. Embeddings and norms stay in full precision: they are small and quality-sensitive. The
full-precision weights are dropped as each matrix is quantized (`LlamaForCausalLM.fuse`), so
the process holds only the low-bit copy.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from engine.weights import MkldnnWeight, linear_add_full, linear_full, pack_full_precision

if TYPE_CHECKING:
    from engine.model import LlamaForCausalLM

QUANTIZATIONS = ("int8", "int4")
INT4_GROUP = 32  # inputs per int4 scale/zero: 32 keeps the small models' logits close


@functools.cache
def _cuda_int8_kernel(device: torch.device) -> bool:
    """Whether this build has `_weight_int8pack_mm` for CUDA (newer builds; probed once)."""
    try:
        x = torch.ones((1, 32), dtype=torch.bfloat16, device=device)
        q = torch.ones((8, 32), dtype=torch.int8, device=device)
        torch.ops.aten._weight_int8pack_mm(x, q, torch.ones(8, dtype=torch.bfloat16, device=device))
    except (RuntimeError, NotImplementedError):
        return False
    return True


@dataclass(frozen=True)
class Int8Weight:
    """A quantized [out, in] weight: int8 values and per-output-channel scales."""

    qweight: torch.Tensor  # int8 [out, in], row-major as the kernel reads it
    scales: torch.Tensor  # [out], in `compute_dtype`
    compute_dtype: torch.dtype  # the activations' dtype inside the kernel
    kernel: bool  # False: CUDA build without the int8 kernel, dequantized per call

    @classmethod
    def quantize(cls, weight: torch.Tensor | Int8Weight) -> Int8Weight:
        if isinstance(weight, Int8Weight):  # quantizing twice would only lose precision
            return weight
        w = weight.detach().float()
        on_cpu = weight.device.type == "cpu"
        compute = torch.bfloat16 if on_cpu else weight.dtype
        kernel = on_cpu or (compute == torch.bfloat16 and _cuda_int8_kernel(weight.device))
        # Rounded to the kernel's dtype before quantizing, so the values are rounded against
        # the scale the kernel multiplies by (a bf16 scale is off by up to 1/256).
        scales = (w.abs().amax(dim=1).clamp(min=1e-8) / 127.0).to(compute)
        codes = torch.round(w / scales.float()[:, None]).clamp(-128, 127)
        return cls(codes.to(torch.int8).contiguous(), scales, compute, kernel)

    def dequantize(self) -> torch.Tensor:
        return self.qweight.to(torch.float32) * self.scales.float()[:, None]

    @property
    def nbytes(self) -> int:
        return self.qweight.nbytes + self.scales.nbytes

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if not self.kernel:  # gpt-fast's CUDA form: inductor fuses the cast into the matmul
            return F.linear(x, self.qweight.to(x.dtype)) * self.scales
        inner = x if x.dtype == self.compute_dtype else x.to(self.compute_dtype)
        out = torch.ops.aten._weight_int8pack_mm(inner, self.qweight, self.scales)
        return out if out.dtype == x.dtype else out.to(x.dtype)


@dataclass(frozen=True)
class Int4Weight:
    """A quantized [out, in] weight: int4 values packed for the kernel, per-group scale/zero."""

    packed: torch.Tensor  # the kernel's own layout
    scales_and_zeros: torch.Tensor  # bfloat16 [in / group, out, 2]
    group_size: int
    out_features: int
    in_features: int

    @classmethod
    def quantize(cls, weight: torch.Tensor, group_size: int = INT4_GROUP) -> Int4Weight:
        out_features, in_features = weight.shape
        if in_features % group_size:
            raise ValueError(
                f"int4: a matrix with {in_features} inputs cannot be split in groups of "
                f"{group_size}; use quantization='int8' for this model"
            )
        w = weight.detach().float().reshape(-1, group_size)
        low, high = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
        scales = (high - low).clamp(min=1e-6) / 15
        zeros = low + scales * 8  # the value of code 8: codes are stored offset by 8
        codes = (w - low).div(scales).round().clamp(0, 15).to(torch.int32)
        codes = codes.reshape(out_features, in_features)
        scales_and_zeros = (
            torch.cat(
                [
                    scales.reshape(out_features, -1, 1),
                    zeros.reshape(out_features, -1, 1),
                ],
                dim=2,
            )
            .transpose(0, 1)
            .contiguous()
            .to(torch.bfloat16)
        )
        if weight.device.type == "cpu":
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        else:
            pairs = (codes[:, ::2] << 4 | codes[:, 1::2]).to(torch.uint8)
            packed = torch.ops.aten._convert_weight_to_int4pack(pairs, 8)
        return cls(packed, scales_and_zeros, group_size, out_features, in_features)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales_and_zeros.nbytes

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        inner = x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)
        if x.device.type == "cpu":
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(
                inner, self.packed, self.group_size, self.scales_and_zeros
            )
        else:
            out = torch.ops.aten._weight_int4pack_mm(
                inner, self.packed, self.group_size, self.scales_and_zeros
            )
        return out if out.dtype == x.dtype else out.to(x.dtype)


Weight = torch.Tensor | MkldnnWeight | Int8Weight | Int4Weight
WeightPacker = Callable[[torch.Tensor], Weight]


def linear(x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear` for any weight format."""
    if isinstance(weight, (Int8Weight, Int4Weight)):
        if x.dim() == 2:
            out = weight.matmul(x)
        else:  # the kernels take [rows, in] only
            out = weight.matmul(x.reshape(-1, x.shape[-1])).view(*x.shape[:-1], -1)
        return out if bias is None else out + bias
    return linear_full(x, weight, bias)


def linear_add(
    residual: torch.Tensor, x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`residual + linear(x, weight, bias)` for 2-D `residual` and `x`; one kernel when it can."""
    if isinstance(weight, (Int8Weight, Int4Weight)):
        return residual + linear(x, weight, bias)
    return linear_add_full(residual, x, weight, bias)


def weight_packer(quantization: str | None) -> WeightPacker:
    """The function `fuse` turns each [out, in] matrix into its stored form with."""
    if quantization is None:
        return pack_full_precision
    if quantization == "int8":
        return Int8Weight.quantize
    if quantization == "int4":
        return _int4_or_int8
    raise ValueError(f"quantization {quantization!r} is not supported; use one of {QUANTIZATIONS}")


def _int4_or_int8(weight: torch.Tensor) -> Int4Weight | Int8Weight:
    # A shape the kernel cannot tile (an LM head over an odd vocabulary) falls back to int8
    # rather than refusing the model.
    # The CPU kernel also packs outputs in tiles of 16.
    if weight.shape[1] % INT4_GROUP or weight.shape[0] % 16:
        return Int8Weight.quantize(weight)
    return Int4Weight.quantize(weight)


def quantize_model(model: LlamaForCausalLM, quantization: str = "int8") -> None:
    """Quantize a loaded model's linear layers and LM head; the float copies are freed."""
    if model.quantization == quantization:
        return
    model.fuse(quantization)


def linear_weight_bytes(model: LlamaForCausalLM) -> int:
    """Bytes held by the weights the forward pass multiplies with (fused layers + LM head)."""
    total = 0
    for layer in model.decoder_layers:
        attn, mlp = layer.self_attn, layer.mlp
        for weight in (attn.qkv_weight, attn.o_weight, mlp.gate_up_weight, mlp.down_weight):
            total += weight.nbytes
    return total + model.lm_head_weight.nbytes
