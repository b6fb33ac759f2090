"""A Llama-style decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) over a paged KV cache.

Parameter names follow Hugging Face's `LlamaForCausalLM`, so a checkpoint's state dict loads
as it is. One `forward` serves prefill (many tokens per sequence), decode (one token per
sequence) and anything in between: every call writes its tokens' keys and values into the
cache slots of their positions, then attends over each sequence's cached context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import CheckpointError, ModelConfig


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


def rope_inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    dim = config.head_dim
    inv_freq = 1.0 / (
        config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    )
    scaling = config.rope_scaling
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low_freq_factor = float(scaling["low_freq_factor"])
        high_freq_factor = float(scaling["high_freq_factor"])
        old_context = float(scaling["original_max_position_embeddings"])
        low_freq_wavelen = old_context / low_freq_factor
        high_freq_wavelen = old_context / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    raise CheckpointError(
        f"config.json: rope_scaling type '{kind}' is not supported; supported: default, "
        "linear, llama3"
    )


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass
class AttentionBatch:
    """Where this forward's tokens go in the paged cache and which keys each may see.

    slot_mapping: [N] cache slot of each valid token (flattened over the batch).
    valid: [B, T] which query positions are real tokens (the rest is padding).
    context_slots: [B, L] cache slot of each key position 0..L-1 of every sequence.
    mask: [B, 1, T, L] True where a query may attend to a key.
    """

    slot_mapping: torch.Tensor
    valid: torch.Tensor
    context_slots: torch.Tensor
    mask: torch.Tensor


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        batch: AttentionBatch,
    ) -> torch.Tensor:
        bsz, seq_len, _ = hidden.shape
        q = self.q_proj(hidden).view(bsz, seq_len, self.num_heads, self.head_dim)
        k = self.k_proj(hidden).view(bsz, seq_len, self.num_kv_heads, self.head_dim)
        v = self.v_proj(hidden).view(bsz, seq_len, self.num_kv_heads, self.head_dim)
        cos = cos.unsqueeze(2)
        sin = sin.unsqueeze(2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin

        # The cache is flat over slots: [num_blocks * block_size, kv_heads, head_dim].
        key_cache[batch.slot_mapping] = k[batch.valid]
        value_cache[batch.slot_mapping] = v[batch.valid]
        keys = key_cache[batch.context_slots].transpose(1, 2)  # [B, kv_heads, L, D]
        values = value_cache[batch.context_slots].transpose(1, 2)

        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            keys,
            values,
            attn_mask=batch.mask,
            enable_gqa=self.num_kv_heads != self.num_heads,
        )
        out = out.transpose(1, 2).reshape(bsz, seq_len, self.num_heads * self.head_dim)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        bias = config.mlp_bias
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(hidden)) * self.up_proj(hidden))


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


class LlamaForCausalLM(nn.Module):
    """The decoder plus the LM head; `forward` returns final hidden states, `logits` projects."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inverse_frequencies(config), persistent=False)

    def rope(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32).unsqueeze(-1) * self.inv_freq.to(torch.float32)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        key_caches: list[torch.Tensor],
        value_caches: list[torch.Tensor],
        batch: AttentionBatch,
    ) -> torch.Tensor:
        hidden = self.model.embed_tokens(input_ids)
        cos, sin = self.rope(positions, hidden.dtype)
        for layer, key_cache, value_cache in zip(
            self.model.layers, key_caches, value_caches, strict=True
        ):
            residual = hidden
            hidden = layer.self_attn(
                layer.input_layernorm(hidden), cos, sin, key_cache, value_cache, batch
            )
            hidden = residual + hidden
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.model.norm(hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
