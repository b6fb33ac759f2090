"""One forward pass per step: the running decodes and the step's prefill chunks together.

A step that both decodes and prefills used to run two forward passes (the chunks, then the
decodes): on a small model each pass costs mostly its fixed overhead (a few hundred ops), so
the prefill chunk doubled the step of every decode riding beside it. Here they are one ragged
batch, as vLLM and Sarathi-Serve run them: every token of the step (one per decode, `count`
per chunk) is a row of one [tokens, hidden] matrix, so each projection and the MLP run once
over all of them. Only attention is done per group, over the paged cache: the decodes
together ([decodes, 1] queries, each over its own context, shorter ones masked), then each
chunk ([1, count] queries, causal over its cached prefix and itself). No padding is computed.

Each group reads the same keys, in the same order, as the two-pass step did, so greedy output
is token for token the same (tests/unit/test_fused_step.py, every policy and quantization).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.kv_cache import PagedKVCache
from engine.model import FusedLayer, LlamaForCausalLM, _sliding_window_mask
from engine.quantize import linear, linear_add
from engine.sequence import Sequence

__all__ = ["AttentionGroup", "RaggedBatch", "fused_forward", "ragged_forward"]


@dataclass
class AttentionGroup:
    """Rows `start`..`start + rows * width` of the step's tokens, attended as [rows, width]
    queries over `slots` (flat [rows * context] cache slots) under `mask`."""

    start: int
    rows: int
    width: int
    slots: torch.Tensor
    context: tuple[int, int, int, int]  # (rows, context length, kv_heads, head_dim)
    mask: torch.Tensor | None

    def attend(
        self,
        q: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        q_size: int,
        gqa: bool,
    ) -> torch.Tensor:
        """This group's attention output [rows * width, q_size] (q: the step's [1, N, h, D])."""
        tokens = self.rows * self.width
        queries = q[0, self.start : self.start + tokens]
        queries = queries.reshape(self.rows, self.width, -1, queries.shape[-1]).transpose(1, 2)
        keys = key_cache.index_select(0, self.slots).view(self.context).transpose(1, 2)
        values = value_cache.index_select(0, self.slots).view(self.context).transpose(1, 2)
        attn = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=self.mask, enable_gqa=gqa
        )
        return attn.transpose(1, 2).reshape(tokens, q_size)


@dataclass
class RaggedBatch:
    """Where every token of a fused step goes in the cache, and its attention groups."""

    slot_mapping: torch.Tensor  # [N] cache slot of each token
    groups: list[AttentionGroup]
    max_position: int  # the largest position of the step (RoPE table size)


def _group(
    cache: PagedKVCache,
    model: LlamaForCausalLM,
    start: int,
    tables: list[list[int]],
    starts: list[int],
    counts: list[int],
) -> tuple[AttentionGroup, torch.Tensor, torch.Tensor]:
    """One group as `PagedKVCache.build_batch` lays it out: (group, slot mapping, positions)."""
    batch, positions = cache.build_batch(tables, starts, counts)
    config = model.config
    length = batch.context_slots.shape[1]
    mask = batch.mask
    window = config.sliding_window
    if window is not None and length > window:
        mask = _sliding_window_mask(positions, length, window, mask)
    context = (len(tables), length, config.num_key_value_heads, config.head_dim)
    group = AttentionGroup(
        start, len(tables), max(counts), batch.context_slots.view(-1), context, mask
    )
    return group, batch.slot_mapping, positions.reshape(-1)


def build_ragged(
    model: LlamaForCausalLM,
    cache: PagedKVCache,
    decodes: list[Sequence],
    chunks: list[tuple[Sequence, int]],
) -> tuple[torch.Tensor, torch.Tensor, RaggedBatch, list[int]]:
    """The step's token ids [N], positions [N], batch, and the rows whose logits are wanted:
    one per decode, then the last token of each chunk. Decodes come first, in order."""
    parts: list[tuple[AttentionGroup, torch.Tensor, torch.Tensor]] = []
    ids: list[int] = []
    rows: list[int] = []
    if decodes:
        parts.append(
            _group(
                cache,
                model,
                0,
                [s.block_table for s in decodes],
                [s.num_tokens - 1 for s in decodes],
                [1] * len(decodes),
            )
        )
        ids.extend(s.output_ids[-1] for s in decodes)
        rows.extend(range(len(decodes)))
    for sequence, count in chunks:
        start = sequence.num_cached
        parts.append(_group(cache, model, len(ids), [sequence.block_table], [start], [count]))
        ids.extend(sequence.all_ids[start : start + count])
        rows.append(len(ids) - 1)
    groups = [group for group, _, _ in parts]
    max_position = max(group.context[1] for group in groups) - 1
    batch = RaggedBatch(torch.cat([slots for _, slots, _ in parts]), groups, max_position)
    input_ids = torch.tensor(ids, dtype=torch.long).to(cache.device)
    return input_ids, torch.cat([positions for _, _, positions in parts]), batch, rows


def ragged_forward(
    model: LlamaForCausalLM,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    key_caches: list[torch.Tensor],
    value_caches: list[torch.Tensor],
    batch: RaggedBatch,
) -> torch.Tensor:
    """The decoder over a ragged batch: final hidden states [N, hidden]."""
    if not model.fused:
        model.fuse()
    config = model.config
    q_size = config.num_attention_heads * config.head_dim
    gqa = config.num_attention_heads != config.num_key_value_heads
    shape = (1, input_ids.shape[0])
    hidden = F.embedding(input_ids, model.model.embed_tokens.weight)
    cos, sin = model.rope(positions.view(shape), hidden.dtype, batch.max_position)
    layers: list[FusedLayer] = model.fused
    for layer, key_cache, value_cache in zip(layers, key_caches, value_caches, strict=True):
        q, new_k, new_v = _rotary_qkv(model, layer, hidden, cos, sin)
        # Every token's keys and values are in the cache before any group reads its context.
        key_cache.index_copy_(0, batch.slot_mapping, new_k)
        value_cache.index_copy_(0, batch.slot_mapping, new_v)
        parts = [g.attend(q, key_cache, value_cache, q_size, gqa) for g in batch.groups]
        attn = parts[0] if len(parts) == 1 else torch.cat(parts)
        hidden = _feed_forward(model, layer, hidden, attn)
    return model._norm(hidden, model.final_norm)


def _rotary_qkv(
    model: LlamaForCausalLM,
    layer: FusedLayer,
    hidden: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer's queries [1, N, heads, D] and new keys and values [N, kv_heads, D], RoPE
    applied: `LlamaForCausalLM.forward`'s math, on the step's N tokens as one row. That
    forward inlines it (a method call per layer costs 1-2% of a batch-1 decode step on a
    CPU); tests/unit/test_fused_step.py holds the two to the same logits."""
    config = model.config
    heads, kv_heads, head_dim = (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    )
    q_size, kv_size, half = heads * head_dim, kv_heads * head_dim, head_dim // 2
    tokens = hidden.shape[0]
    qkv = linear(model._norm(hidden, layer.input_norm), layer.qkv_weight, layer.qkv_bias)
    qk = qkv[:, : q_size + kv_size].view(1, tokens, heads + kv_heads, head_dim)
    swapped = torch.cat((qk[..., half:], qk[..., :half]), dim=-1)
    qk = qk * cos + swapped * sin
    new_k = qk[:, :, heads:].reshape(tokens, kv_heads, head_dim)
    new_v = qkv[:, q_size + kv_size :].view(tokens, kv_heads, head_dim)
    return qk[:, :, :heads], new_k, new_v


def _feed_forward(
    model: LlamaForCausalLM, layer: FusedLayer, hidden: torch.Tensor, attn: torch.Tensor
) -> torch.Tensor:
    """The rest of a layer after attention: the output projection and the SwiGLU MLP."""
    intermediate = model.config.intermediate_size
    hidden = linear_add(hidden, attn, layer.o_weight, layer.o_bias)
    gate_up = linear(model._norm(hidden, layer.post_norm), layer.gate_up_weight, layer.gate_up_bias)
    gate, up = gate_up[:, :intermediate], gate_up[:, intermediate:]
    return linear_add(hidden, F.silu(gate) * up, layer.down_weight, layer.down_bias)


FusedLogits = tuple[torch.Tensor, torch.Tensor]


def fused_forward(
    chunks: list[tuple[Sequence, int]],
) -> Callable[[LlamaForCausalLM, PagedKVCache, list[Sequence]], FusedLogits]:
    """The worker's forward for a step with decodes and chunks, called with the decoding
    sequences followed by the chunks' (the worker ends all of them if it fails). Returns
    (decode logits [decodes, vocab], chunk logits [chunks, vocab]), the latter meaningful
    only where a chunk ends its prompt."""

    def forward(
        model: LlamaForCausalLM, cache: PagedKVCache, sequences: list[Sequence]
    ) -> FusedLogits:
        decodes = sequences[: len(sequences) - len(chunks)]
        input_ids, positions, batch, rows = build_ragged(model, cache, decodes, chunks)
        hidden = ragged_forward(model, input_ids, positions, cache.keys, cache.values, batch)
        index = torch.tensor(rows, device=hidden.device)
        logits = model.logits(hidden.index_select(0, index))
        for sequence in decodes:
            sequence.num_cached = sequence.num_tokens
        for sequence, count in chunks:
            sequence.num_cached += count
        return logits[: len(decodes)], logits[len(decodes) :]

    return forward
