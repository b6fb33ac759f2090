"""How one forward's tokens attend over the paged KV cache, the same way in every layer.

`Attention.forward` (engine/model.py) computes a layer's queries, keys and values, writes the
keys and values into the layer's cache where the forward's `Attend` says, reads back the
context it names, and hands the queries and that context to its `attend`, which attends each
query over its sequence's context. `PaddedAttention` serves a [B, T] batch (the kv cache's
`AttentionBatch`: prefill, decode, speculative verification); engine/fused.py's `RaggedBatch`
serves a step's decodes and prefill chunks as one ragged batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from engine.config import ModelConfig


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


class Attend(Protocol):
    """How one forward's tokens attend over the paged cache, the same for every layer.

    Each layer writes its tokens' keys and values into its cache at `slot_mapping` (the rows
    `token_index` keeps, if any: padding is not cached), reads back the rows `context_slots`
    names, and attends the queries over them with `attend`.
    """

    token_index: torch.Tensor | None  # [N] rows (of the forward's tokens) that are cached
    slot_mapping: torch.Tensor  # [N] cache slot of each cached token
    context_slots: torch.Tensor  # the cache slots of every sequence's context, flat
    max_position: int  # the largest position of the forward (the RoPE table's size)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """The tokens' queries [tokens, heads, D] over their contexts, the rows `context_slots`
        names of a layer's cache ([slots, kv_heads, D] each): [tokens, heads * D]."""
        ...


@dataclass
class LayerInputs:
    """What every layer of one forward reads besides the hidden states: the RoPE tables at
    the tokens' positions ([tokens, 1, D]) and how the tokens attend."""

    cos: torch.Tensor
    sin: torch.Tensor
    attention: Attend


def sliding_window_mask(
    positions: torch.Tensor, length: int, window: int, mask: torch.Tensor | None
) -> torch.Tensor:
    """`mask` narrowed to Mistral's window: a query at position p sees keys p-window+1..p.

    Built only once a context outgrows the window. The cache still holds every key (no memory
    saved), but each query attends to exactly the keys the checkpoint was trained with.
    """
    keys = torch.arange(length, device=positions.device)
    visible = (positions.view(positions.shape[0], -1, 1) - keys < window).unsqueeze(1)
    return visible if mask is None else mask & visible


@dataclass
class PaddedAttention:
    """A [B, T] batch's attention (`LlamaForCausalLM.forward`): each sequence's T queries
    over its context of L keys, shorter rows masked."""

    token_index: torch.Tensor | None  # the batch's
    slot_mapping: torch.Tensor  # the batch's
    context_slots: torch.Tensor  # the batch's, flat
    max_position: int  # L - 1
    context: tuple[int, int, int, int]  # (B, L, kv_heads, head_dim)
    queries: tuple[int, int, int, int]  # (B, T, heads, head_dim)
    mask: torch.Tensor | None  # the batch's, narrowed to a sliding window
    gqa: bool

    @classmethod
    def of(
        cls, batch: AttentionBatch, positions: torch.Tensor, config: ModelConfig
    ) -> PaddedAttention:
        bsz, width = positions.shape
        length = batch.context_slots.shape[1]
        mask, window = batch.mask, config.sliding_window
        if window is not None and length > window:
            mask = sliding_window_mask(positions, length, window, mask)
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        context = (bsz, length, kv_heads, config.head_dim)
        queries = (bsz, width, heads, config.head_dim)
        # The largest position is below the longest context (no device sync to find it).
        slots, top, gqa = batch.context_slots.view(-1), length - 1, heads != kv_heads
        return cls(batch.token_index, batch.slot_mapping, slots, top, context, queries, mask, gqa)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        keys = keys.view(self.context).transpose(1, 2)
        values = values.view(self.context).transpose(1, 2)
        decode = self.queries[1] == 1  # one query per sequence: [B, heads, 1, D] as it is
        queries = q.unsqueeze(2) if decode else q.view(self.queries).transpose(1, 2)
        attn = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=self.mask, enable_gqa=self.gqa
        )
        return (attn if decode else attn.transpose(1, 2)).reshape(q.shape[0], -1)
