"""A Llama-style decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) over a paged KV cache.

Parameter names follow Hugging Face's `LlamaForCausalLM`, so a checkpoint's state dict loads
as it is. One `forward` serves prefill (many tokens per sequence), decode (one token per
sequence) and anything in between: every call writes its tokens' keys and values into the
cache slots of their positions, then attends over each sequence's cached context.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig
from engine.quantize import Weight, linear, linear_add, weight_packer
from engine.rope import rope_inverse_frequencies
from engine.weights import pack_full_precision, repacks


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden.dtype
        hidden = hidden.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        hidden = hidden * torch.rsqrt(variance + self.eps)
        return self.weight * hidden.to(input_dtype)


@dataclass
class AttentionBatch:
    """Where this forward's tokens go in the paged cache and which keys each may see.

    token_index: [N] flat index (into B*T) of each real token; None when there is no padding.
    slot_mapping: [N] cache slot of each real token.
    context_slots: [B, L] cache slot of each key position 0..L-1 of every sequence.
    mask: [B, 1, T, L] True where a query may attend to a key; None when every query may see
    every key (one sequence decoding one token).
    """

    token_index: torch.Tensor | None
    slot_mapping: torch.Tensor
    context_slots: torch.Tensor
    mask: torch.Tensor | None


class Attention(nn.Module):
    """Holds the checkpoint's q/k/v/o projections; `fuse` packs q, k and v into one matmul."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = config.attention_bias  # q, k and v (Qwen2 has these without an o_proj bias)
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(
            self.num_heads * self.head_dim, config.hidden_size, bias=config.o_proj_bias
        )


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        bias = config.mlp_bias
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


@dataclass
class FusedLayer:
    """One decoder layer's weights packed for the forward pass (q|k|v and gate|up fused)."""

    input_norm: torch.Tensor
    qkv_weight: Weight
    qkv_bias: torch.Tensor | None
    o_weight: Weight
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up_weight: Weight
    gate_up_bias: torch.Tensor | None
    down_weight: Weight
    down_bias: torch.Tensor | None


def _pack(linears: tuple[nn.Linear, ...], pack: Callable[[torch.Tensor], Weight]) -> Weight:
    """The linears' weights stacked as one [out, in] matrix, in the form `pack` stores.

    When that form is a plain tensor, the modules' own weights become views into it, so the
    model holds each weight once. Any other form (prepacked bf16, int8, int4) replaces them:
    the modules keep placeholders on the meta device and the full-precision copy is freed.
    """
    weight = torch.cat([module.weight for module in linears]).detach()
    stored = pack(weight)
    del weight
    offset = 0
    for module in linears:
        rows = module.weight.shape[0]
        if isinstance(stored, torch.Tensor) and stored.dtype == module.weight.dtype:
            module.weight.data = stored[offset : offset + rows]
        else:
            module.weight = _placeholder(module.weight)
        offset += rows
    return stored


def _placeholder(weight: torch.Tensor) -> nn.Parameter:
    """A weight's shape and dtype without its memory (on the meta device)."""
    return nn.Parameter(torch.empty_like(weight, device="meta"), requires_grad=False)


def _cat_bias(*linears: nn.Linear) -> torch.Tensor | None:
    if linears[0].bias is None:
        return None
    return torch.cat([linear.bias for linear in linears])


def _sliding_window_mask(
    positions: torch.Tensor, length: int, window: int, mask: torch.Tensor | None
) -> torch.Tensor:
    """`mask` narrowed to Mistral's window: a query at position p sees keys p-window+1..p.

    Built only once a context outgrows the window. The cache still holds every key (no memory
    saved), but each query attends to exactly the keys the checkpoint was trained with.
    """
    keys = torch.arange(length, device=positions.device)
    visible = (positions.view(positions.shape[0], -1, 1) - keys < window).unsqueeze(1)
    return visible if mask is None else mask & visible


def _cache_and_gather(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    new_k: torch.Tensor,
    new_v: torch.Tensor,
    batch: AttentionBatch,
    slots: torch.Tensor,
    context: tuple[int, int, int, int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Writes a layer's new keys and values [tokens, kv_heads, head_dim] into the paged cache at
    their slots (padding left out), then reads every sequence's context back from `slots` (the
    flat `batch.context_slots`): keys and values [B, kv_heads, L, head_dim] for attention."""
    if batch.token_index is not None:
        new_k = new_k.index_select(0, batch.token_index)
        new_v = new_v.index_select(0, batch.token_index)
    key_cache.index_copy_(0, batch.slot_mapping, new_k)
    value_cache.index_copy_(0, batch.slot_mapping, new_v)
    keys = key_cache.index_select(0, slots).view(context).transpose(1, 2)
    values = value_cache.index_select(0, slots).view(context).transpose(1, 2)
    return keys, values


class LlamaForCausalLM(nn.Module):
    """The decoder plus the LM head; `forward` returns final hidden states, `logits` projects.

    The modules mirror Hugging Face's names for loading. The forward pass runs on packed
    weights (`fuse`, called by the loader) through plain functions: at the sizes this engine
    serves on a CPU, per-op overhead, not arithmetic, is what a decode step costs.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inverse_frequencies(config), persistent=False)
        self.fused: list[FusedLayer] = []
        self.quantization: str | None = None  # the format `fuse` stored the weights in
        self._rope_tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}
        self.norm_floor = torch.empty(0)  # sqrt(eps * hidden_size) for `_norm`, set by fuse()
        self.final_norm: torch.Tensor = self.model.norm.weight.detach()  # set again by fuse()
        self.lm_head_weight: Weight = self.lm_head.weight.detach()  # set again by fuse()
        # `decode_logits` compiled for these weights (engine/compiled.py), or None: eager.
        self.compiled_forward: Callable[..., torch.Tensor] | None = None

    @property
    def decoder_layers(self) -> list[DecoderLayer]:
        """The decoder layers, typed (iterating an nn.ModuleList yields plain Modules)."""
        return [cast(DecoderLayer, layer) for layer in self.model.layers]

    def fuse(self, quantization: str | None = None) -> None:
        """Pack the weights for inference; call again after changing any weight.

        `quantization` ("int8", "int4") stores the linear layers and the LM head in that
        format and frees their full-precision copies: the model cannot be fused again after.
        """
        if any(p.is_meta for p in self.parameters()):
            raise RuntimeError(
                f"the weights are stored as {self.quantization or 'prepacked bfloat16'} and their "
                "full-precision copies were freed; load the checkpoint again to repack them"
            )
        pack = weight_packer(quantization)
        fused = []
        for layer in self.decoder_layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv = (attn.q_proj, attn.k_proj, attn.v_proj)
            gate_up = (mlp.gate_proj, mlp.up_proj)
            fused.append(
                FusedLayer(
                    input_norm=self._norm_weight(layer.input_layernorm.weight),
                    qkv_weight=_pack(qkv, pack),
                    qkv_bias=_cat_bias(*qkv),
                    o_weight=_pack((attn.o_proj,), pack),
                    o_bias=attn.o_proj.bias,
                    post_norm=self._norm_weight(layer.post_attention_layernorm.weight),
                    gate_up_weight=_pack(gate_up, pack),
                    gate_up_bias=_cat_bias(*gate_up),
                    down_weight=_pack((mlp.down_proj,), pack),
                    down_bias=mlp.down_proj.bias,
                )
            )
        self.fused = fused
        self.final_norm = self._norm_weight(self.model.norm.weight)
        floor = math.sqrt(self.config.rms_norm_eps * self.config.hidden_size)
        self.norm_floor = torch.tensor([floor], device=self.final_norm.device)
        self._rope_tables = {}  # rebuilt lazily on the weights' device and dtype
        self.lm_head_weight = self._pack_lm_head(pack)
        self.quantization = quantization
        self.compiled_forward = None  # frozen on the old weights: compile again if wanted

    def _pack_lm_head(self, pack: Callable[[torch.Tensor], Weight]) -> Weight:
        head = self.lm_head.weight.detach()
        if pack is pack_full_precision and not repacks(head):
            return head  # [vocab, hidden] row-major as it is: no copy of a tied embedding
        stored = pack(head)
        if not self.config.tie_word_embeddings:  # a tied head is the embedding: it stays
            self.lm_head.weight = _placeholder(head)
        return stored

    def _norm_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """An RMSNorm weight as `_norm` takes it: in float32, times sqrt(width)."""
        return weight.detach().float() * math.sqrt(weight.shape[0])

    def rope(
        self, positions: torch.Tensor, dtype: torch.dtype, max_position: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin for `x * cos + roll(x, half) * sin` (HF's rotate_half form).

        Read from tables computed once (grown on demand), as HF computes them: angles in
        float32, then cast; two lookups per forward instead of ten ops.
        """
        needed = (max_position if max_position is not None else int(positions.max())) + 1
        table = self._rope_tables.get(dtype)
        if table is None or table[0].shape[0] < needed:
            length = max(needed, 2 * (0 if table is None else table[0].shape[0]), 256)
            inv_freq = cast(torch.Tensor, self.inv_freq)
            steps = torch.arange(length, device=inv_freq.device, dtype=torch.float32)
            freqs = steps.unsqueeze(-1) * inv_freq.to(torch.float32)
            cos = torch.cat((freqs, freqs), dim=-1).cos()
            sin = freqs.sin()
            table = (cos.to(dtype), torch.cat((-sin, sin), dim=-1).to(dtype))
            self._rope_tables[dtype] = table
        return table[0][positions].unsqueeze(2), table[1][positions].unsqueeze(2)

    def _norm(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm with a weight from `_norm_weight`.

        In float32 it is `x / hypot(|x|, sqrt(eps * d)) * (w * sqrt(d))`: the same value as
        `x * rsqrt(mean(x^2) + eps) * w` in four small ops, where `F.rms_norm` on a CPU runs
        a chain of about ten (a fifth of a decode step).
        """
        if hidden.dtype == torch.float32:
            length = torch.linalg.vector_norm(hidden, dim=-1, keepdim=True)
            return hidden / torch.hypot(length, self.norm_floor) * weight
        # Lower precisions normalize in float32 and round once at the end (HF rounds before
        # the weight); `F.rms_norm` on bf16 takes about ten internal copies on a CPU.
        return self._norm(hidden.float(), weight).to(hidden.dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        key_caches: list[torch.Tensor],
        value_caches: list[torch.Tensor],
        batch: AttentionBatch,
    ) -> torch.Tensor:
        if not self.fused:
            self.fuse()
        config = self.config
        bsz, seq_len = input_ids.shape
        heads, kv_heads, head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        q_size, kv_size = heads * head_dim, kv_heads * head_dim
        intermediate = config.intermediate_size
        half = head_dim // 2
        gqa = heads != kv_heads
        tokens = bsz * seq_len
        # Hidden states stay [tokens, hidden]: each projection is one matrix product, and the
        # residual add rides along with it (`linear_add`).
        hidden = F.embedding(input_ids.view(tokens), self.model.embed_tokens.weight)
        # Every position is below the longest context of the batch (no device sync to find it).
        cos, sin = self.rope(positions, hidden.dtype, batch.context_slots.shape[1] - 1)
        slots = batch.context_slots.view(-1)
        context = (bsz, batch.context_slots.shape[1], kv_heads, head_dim)
        mask = batch.mask
        window = config.sliding_window
        if window is not None and context[1] > window:
            mask = _sliding_window_mask(positions, context[1], window, mask)
        for layer, key_cache, value_cache in zip(self.fused, key_caches, value_caches, strict=True):
            qkv = linear(self._norm(hidden, layer.input_norm), layer.qkv_weight, layer.qkv_bias)
            # q and k are adjacent in the packed projection: rotate both in one go.
            qk = qkv[:, : q_size + kv_size].view(bsz, seq_len, heads + kv_heads, head_dim)
            # The halves swapped (`roll` by half, which takes a slow path in bfloat16 on a CPU).
            swapped = torch.cat((qk[..., half:], qk[..., :half]), dim=-1)
            qk = qk * cos + swapped * sin
            q = qk[:, :, :heads]
            new_k = qk[:, :, heads:].reshape(tokens, kv_heads, head_dim)
            new_v = qkv[:, q_size + kv_size :].view(tokens, kv_heads, head_dim)
            keys, values = _cache_and_gather(
                key_cache, value_cache, new_k, new_v, batch, slots, context
            )
            attn = F.scaled_dot_product_attention(
                q.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=gqa
            )
            attn = attn.transpose(1, 2).reshape(tokens, q_size)
            hidden = linear_add(hidden, attn, layer.o_weight, layer.o_bias)
            gate_up = linear(
                self._norm(hidden, layer.post_norm), layer.gate_up_weight, layer.gate_up_bias
            )
            gate, up = gate_up[:, :intermediate], gate_up[:, intermediate:]
            hidden = linear_add(hidden, F.silu(gate) * up, layer.down_weight, layer.down_bias)
        return self._norm(hidden, self.final_norm).view(bsz, seq_len, -1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return linear(hidden, self.lm_head_weight).float()

    def decode_logits(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        key_caches: list[torch.Tensor],
        value_caches: list[torch.Tensor],
        batch: AttentionBatch,
    ) -> torch.Tensor:
        """One new token per sequence: the forward and the LM head, logits [B, vocab].

        What `torch.compile` builds for decode (engine/compiled.py): with the head in the same
        graph, its conversions fuse with the final norm instead of running as separate ops.
        """
        hidden = self.forward(input_ids, positions, key_caches, value_caches, batch)
        return self.logits(hidden[:, -1])
