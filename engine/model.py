"""A Llama-style decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) over a paged KV cache.

Parameter names follow Hugging Face's `LlamaForCausalLM`, so a checkpoint's state dict loads
as it is. Each block has its forward: `Attention.forward`, `MLP.forward`, `RMSNorm.forward`,
and `DecoderLayer.forward` chains them; `LlamaModel.forward` runs the layers. One forward
serves prefill (many tokens per sequence), decode (one token per sequence) and anything in
between: every call writes its tokens' keys and values into the cache slots of their
positions, then attends over each sequence's cached context. How the tokens are laid out is
the `Attend` a forward is given: `PaddedAttention` for a [B, T] batch, engine/fused.py's
`RaggedBatch` for a step of decodes and prefill chunks together.

The blocks multiply with their weights packed for inference (`fuse`: q|k|v and gate|up
stacked, in the stored format), and call each other's `forward` directly: at the sizes this
engine serves on a CPU, per-op overhead, not arithmetic, is what a decode step costs, and
`nn.Module.__call__` adds about 1 us per call (a few percent of a bundled:tiny step).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import Attend, AttentionBatch, LayerInputs, PaddedAttention
from engine.config import ModelConfig
from engine.quantize import Weight, WeightPacker, linear, linear_add, weight_packer
from engine.rope import rope_inverse_frequencies
from engine.weights import pack_full_precision, repacks


class DirectChildren(nn.Module):
    """A module whose child modules are read as plain attributes.

    nn.Module keeps its children in `_modules` and finds one in `__getattr__`, after the
    ordinary lookup failed: about 1 us a read, and a decode step reads a dozen (a few percent
    of a bundled:tiny step). So each child is also kept in the instance's `__dict__`, where
    the ordinary lookup finds it: `nn.Module.__setattr__` drops that copy before registering
    a child, and this puts it back.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in self._modules:
            self.__dict__[name] = self._modules[name]

    def __delattr__(self, name: str) -> None:
        if name in self._modules:
            self.__dict__.pop(name, None)
        super().__delattr__(name)


@functools.cache
def _floor(value: float, device: torch.device) -> torch.Tensor:
    """`value` as a one-element tensor, one per value and device: the norms of a model share
    it, so a compiled forward takes it as one input, not one per norm."""
    return torch.tensor([value], device=device)


class RMSNorm(nn.Module):
    """`x * rsqrt(mean(x^2) + eps) * weight` over the last dimension."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        # What `forward` computes with, from `weight` (`prepare`, called by `fuse`).
        self.scale = torch.empty(0)
        self.floor = torch.empty(0)

    def prepare(self) -> None:
        """The weight in float32 times sqrt(width), and sqrt(eps * width)."""
        width = self.weight.shape[0]
        self.scale = self.weight.detach().float() * math.sqrt(width)
        self.floor = _floor(math.sqrt(self.eps * width), self.scale.device)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """In float32, `x / hypot(|x|, sqrt(eps * d)) * (w * sqrt(d))`: the same value in four
        small ops, where `F.rms_norm` on a CPU runs a chain of about ten (a fifth of a decode
        step)."""
        if hidden.dtype == torch.float32:
            length = torch.linalg.vector_norm(hidden, dim=-1, keepdim=True)
            return hidden / torch.hypot(length, self.floor) * self.scale
        # Lower precisions normalize in float32 and round once at the end (HF rounds before
        # the weight); `F.rms_norm` on bf16 takes about ten internal copies on a CPU.
        return self.forward(hidden.float()).to(hidden.dtype)


class Attention(nn.Module):
    """Grouped-query attention with RoPE over the paged KV cache.

    Holds the checkpoint's q/k/v/o projections; `pack` stacks q, k and v into one matrix
    (one product instead of three), which `forward` multiplies with.
    """

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
        # The packed projection's q|k part and its v part, as `forward` splits it.
        self.qk_v = ((self.num_heads + self.num_kv_heads) * self.head_dim, self.k_proj.out_features)
        self.qkv_weight: Weight = torch.empty(0)  # set by `pack`
        self.qkv_bias: torch.Tensor | None = None
        self.o_weight: Weight = torch.empty(0)
        self.o_bias: torch.Tensor | None = None

    def pack(self, pack: WeightPacker) -> None:
        qkv = (self.q_proj, self.k_proj, self.v_proj)
        self.qkv_weight, self.qkv_bias = pack_linears(qkv, pack), cat_bias(qkv)
        self.o_weight, self.o_bias = pack_linears((self.o_proj,), pack), cat_bias((self.o_proj,))

    def forward(
        self,
        normed: torch.Tensor,
        residual: torch.Tensor,
        inputs: LayerInputs,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
    ) -> torch.Tensor:
        """`residual` plus self-attention over `normed`, both [tokens, hidden]: queries and
        keys rotated (RoPE), the keys and values cached, each token attending over its
        sequence's context; the residual is added in the output projection's product."""
        heads, head_dim = self.num_heads, self.head_dim
        tokens = normed.shape[0]
        # q and k are adjacent in the packed projection: rotate both in one go.
        qkv = linear(normed, self.qkv_weight, self.qkv_bias)
        qk, new_v = qkv.split_with_sizes(self.qk_v, -1)  # C++ (`split` is Python around it)
        qk = qk.view(tokens, -1, head_dim)
        # The halves swapped (`roll` by half, which takes a slow path in bfloat16 on a CPU).
        half = head_dim // 2
        swapped = torch.cat((qk[..., half:], qk[..., :half]), dim=-1)
        qk = qk * inputs.cos + swapped * inputs.sin
        new_k, new_v = qk[:, heads:], new_v.view(tokens, -1, head_dim)
        attention = inputs.attention
        if attention.token_index is not None:  # padding is not cached
            new_k = new_k.index_select(0, attention.token_index)
            new_v = new_v.index_select(0, attention.token_index)
        key_cache.index_copy_(0, attention.slot_mapping, new_k)
        value_cache.index_copy_(0, attention.slot_mapping, new_v)
        keys = key_cache.index_select(0, attention.context_slots)
        values = value_cache.index_select(0, attention.context_slots)
        attn = attention.attend(qk[:, :heads], keys, values)
        return linear_add(residual, attn, self.o_weight, self.o_bias)


class MLP(nn.Module):
    """SwiGLU, `down(silu(gate(x)) * up(x))`; `pack` stacks gate and up into one matrix."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        bias = config.mlp_bias
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)
        self.gate_up_weight: Weight = torch.empty(0)  # set by `pack`
        self.gate_up_bias: torch.Tensor | None = None
        self.down_weight: Weight = torch.empty(0)
        self.down_bias: torch.Tensor | None = None

    def pack(self, pack: WeightPacker) -> None:
        gate_up = (self.gate_proj, self.up_proj)
        self.gate_up_weight, self.gate_up_bias = pack_linears(gate_up, pack), cat_bias(gate_up)
        self.down_weight = pack_linears((self.down_proj,), pack)
        self.down_bias = cat_bias((self.down_proj,))

    def forward(self, normed: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """`residual` plus the MLP of `normed`, added in the down projection's product."""
        gate_up = linear(normed, self.gate_up_weight, self.gate_up_bias)
        gate, up = gate_up.chunk(2, dim=-1)
        return linear_add(residual, F.silu(gate) * up, self.down_weight, self.down_bias)


class DecoderLayer(DirectChildren):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def pack(self, pack: WeightPacker) -> None:
        self.self_attn.pack(pack)
        self.mlp.pack(pack)
        self.input_layernorm.prepare()
        self.post_attention_layernorm.prepare()

    def forward(
        self,
        hidden: torch.Tensor,
        inputs: LayerInputs,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
    ) -> torch.Tensor:
        """Pre-norm residual block: attention, then the MLP, each over its normed input."""
        normed = self.input_layernorm.forward(hidden)
        hidden = self.self_attn.forward(normed, hidden, inputs, key_cache, value_cache)
        return self.mlp.forward(self.post_attention_layernorm.forward(hidden), hidden)


class LlamaModel(DirectChildren):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # `embed_tokens.weight` as a plain tensor (`prepare`): a parameter, like a child
        # module (`DirectChildren`), is read through nn.Module.__getattr__.
        self.embedding = torch.empty(0)

    def prepare(self) -> None:
        """What the forward reads, from the weights; the layers pack their own (`pack`)."""
        self.embedding = self.embed_tokens.weight.detach()
        self.norm.prepare()

    def forward(
        self,
        input_ids: torch.Tensor,
        inputs: LayerInputs,
        key_caches: list[torch.Tensor],
        value_caches: list[torch.Tensor],
    ) -> torch.Tensor:
        """The hidden states [tokens, hidden] of `input_ids` [tokens] after the last layer,
        before the final norm (`norm`, which the caller runs on the rows it needs)."""
        # Hidden states stay [tokens, hidden]: each projection is one matrix product.
        hidden = F.embedding(input_ids, self.embedding)
        for layer, keys, values in zip(self.layers, key_caches, value_caches, strict=True):
            hidden = layer.forward(hidden, inputs, keys, values)
        return hidden


def pack_linears(linears: tuple[nn.Linear, ...], pack: WeightPacker) -> Weight:
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
            module.weight = placeholder(module.weight)
        offset += rows
    return stored


def placeholder(weight: torch.Tensor) -> nn.Parameter:
    """A weight's shape and dtype without its memory (on the meta device)."""
    return nn.Parameter(torch.empty_like(weight, device="meta"), requires_grad=False)


def cat_bias(linears: tuple[nn.Linear, ...]) -> torch.Tensor | None:
    """The linears' biases as one vector, as `pack_linears` stacks their weights (one
    linear's: its own bias, not a copy)."""
    biases: list[torch.Tensor] = [linear.bias for linear in linears]
    if biases[0] is None:
        return None
    return (biases[0] if len(biases) == 1 else torch.cat(biases)).detach()


class LlamaForCausalLM(DirectChildren):
    """The decoder plus the LM head; `forward` returns final hidden states, `logits` projects.

    The modules mirror Hugging Face's names for loading; `fuse` (called by the loader) packs
    their weights for the forward pass.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inverse_frequencies(config), persistent=False)
        self.fused = False  # whether `fuse` packed the weights the forward multiplies with
        self.quantization: str | None = None  # the format `fuse` stored the weights in
        self._rope_tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}
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
        for layer in self.decoder_layers:
            layer.pack(pack)
        self.model.prepare()
        self._rope_tables = {}  # rebuilt lazily on the weights' device and dtype
        self.lm_head_weight = self._pack_lm_head(pack)
        self.quantization = quantization
        self.fused = True
        self.compiled_forward = None  # frozen on the old weights: compile again if wanted

    def _pack_lm_head(self, pack: WeightPacker) -> Weight:
        head = self.lm_head.weight.detach()
        if pack is pack_full_precision and not repacks(head):
            return head  # [vocab, hidden] row-major as it is: no copy of a tied embedding
        stored = pack(head)
        if not self.config.tie_word_embeddings:  # a tied head is the embedding: it stays
            self.lm_head.weight = placeholder(head)
        return stored

    def rope(
        self, positions: torch.Tensor, dtype: torch.dtype, max_position: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin for `x * cos + roll(x, half) * sin` (HF's rotate_half form),
        [tokens, 1, head_dim]: a row per position, as the layers hold their tokens.

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
        shape = (-1, 1, table[0].shape[1])
        return table[0][positions].view(shape), table[1][positions].view(shape)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        key_caches: list[torch.Tensor],
        value_caches: list[torch.Tensor],
        batch: AttentionBatch,
    ) -> torch.Tensor:
        """The final hidden states [B, T, hidden] of `input_ids` [B, T] at `positions`."""
        bsz, seq_len = input_ids.shape
        inputs = self.layer_inputs(positions, PaddedAttention.of(batch, positions, self.config))
        hidden = self.model.forward(input_ids.view(-1), inputs, key_caches, value_caches)
        return self.model.norm.forward(hidden).view(bsz, seq_len, -1)

    def layer_inputs(self, positions: torch.Tensor, attention: Attend) -> LayerInputs:
        """What every layer of a forward reads besides the hidden states: the RoPE tables at
        `positions` (up to `attention.max_position`) and how the tokens attend. The forward
        of a [B, T] batch and engine/fused.py's of a ragged step both start here; the weights
        are packed first if they are not yet."""
        if not self.fused:
            self.fuse()
        cos, sin = self.rope(positions, self.model.embedding.dtype, attention.max_position)
        return LayerInputs(cos, sin, attention)

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
