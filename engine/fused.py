"""One forward pass per step: the running decodes and the step's prefill chunks together.

A step that both decodes and prefills used to run two forward passes (the chunks, then the
decodes): on a small model each pass costs mostly its fixed overhead (a few hundred ops), so
the prefill chunk doubled the step of every decode riding beside it. Here they are one ragged
batch, as vLLM and Sarathi-Serve run them: every token of the step (one per decode, `count`
per chunk) is a row of one [tokens, hidden] matrix, so each projection and the MLP run once
over all of them. Only attention is done per group, over the paged cache: the decodes
together ([decodes, 1] queries, each over its own context, shorter ones masked), then each
chunk ([1, count] queries, causal over its cached prefix and itself). No padding is computed.
The layers that run are the model's own (`LlamaModel.forward`), with the step's `RaggedBatch`
as how their tokens attend (`Attend`, engine/attention.py).

Each group reads the same keys, in the same order, as the two-pass step did, so greedy output
is token for token the same (tests/unit/engine/test_fused_step.py, every policy and quantization).

What a chunk adds to a step of decodes is kept to its arithmetic (on bundled:tiny, a 16-token
chunk of a 900-token prompt costs more multiply-adds in attention alone than the 16 decodes'
whole step): its slots and positions are views of tensors the cache keeps between steps, its
mask is a padded causal triangle, every mask is made additive once per step rather than by
each layer's attention, one gather per layer reads every group's keys, and the LM head runs
only over rows something will sample.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.attention import sliding_window_mask
from engine.kv_cache import PagedKVCache
from engine.model import LlamaForCausalLM
from engine.sequence import Sequence

__all__ = ["AttentionGroup", "RaggedBatch", "fused_forward"]


@dataclass
class AttentionGroup:
    """Rows `start`..`start + rows * width` of the step's tokens, attended as [rows, width]
    queries over the step's gathered context rows `offset`..`offset + rows * length` (the
    `context` shape) under an additive `mask` (0 where a query may see a key, -inf where not).
    """

    start: int
    rows: int
    width: int
    offset: int
    context: tuple[int, int, int, int]  # (rows, context length, kv_heads, head_dim)
    mask: torch.Tensor | None

    def attend(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, gqa: bool
    ) -> torch.Tensor:
        """This group's attention output [rows * width, heads * head_dim] (q: the step's
        [N, heads, head_dim]; keys, values: every group's context, [slots, kv_heads, D])."""
        tokens = self.rows * self.width
        queries = q[self.start : self.start + tokens]
        end = self.offset + self.rows * self.context[1]
        keys, values = keys[self.offset : end], values[self.offset : end]
        if self.rows == 1:  # one sequence: [1, heads, width, D] over [1, kv_heads, L, D]
            attn = F.scaled_dot_product_attention(
                queries.transpose(0, 1).unsqueeze(0),
                keys.transpose(0, 1).unsqueeze(0),
                values.transpose(0, 1).unsqueeze(0),
                attn_mask=self.mask,
                enable_gqa=gqa,
            )
            return attn[0].transpose(0, 1).reshape(tokens, -1)
        # Decodes: [rows, heads, 1, D] over [rows, kv_heads, L, D] (one query: no transpose).
        attn = F.scaled_dot_product_attention(
            queries.unsqueeze(2),
            keys.view(self.context).transpose(1, 2),
            values.view(self.context).transpose(1, 2),
            attn_mask=self.mask,
            enable_gqa=gqa,
        )
        return attn.reshape(tokens, -1)


@dataclass
class RaggedBatch:
    """Where every token of a fused step goes in the cache, and its attention groups."""

    slot_mapping: torch.Tensor  # [N] cache slot of each token
    context_slots: torch.Tensor  # every group's context slots, one after another
    groups: list[AttentionGroup]
    max_position: int  # the largest position of the step (RoPE table size)
    gqa: bool  # fewer key/value heads than query heads
    token_index: torch.Tensor | None = None  # None: no padding, every token is cached

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """`Attend` over the step's groups: the layer cached every token's keys and values
        before any group reads its context, and read every group's in one gather."""
        parts = [group.attend(q, keys, values, self.gqa) for group in self.groups]
        return parts[0] if len(parts) == 1 else torch.cat(parts)


class _Layout:
    """A ragged batch being laid out: each group's tokens, slots and positions in turn."""

    def __init__(self, model: LlamaForCausalLM, cache: PagedKVCache) -> None:
        self.cache = cache
        config = model.config
        self.kv_shape = (config.num_key_value_heads, config.head_dim)
        self.window = config.sliding_window
        self.ids: list[int] = []
        self.groups: list[AttentionGroup] = []
        self.slots: list[torch.Tensor] = []  # slot mapping parts
        self.contexts: list[torch.Tensor] = []  # context slot parts
        self.positions: list[torch.Tensor] = []
        self.offset = 0  # context slots laid out so far
        # Added to the scores in the hidden states' dtype, as SDPA adds a bool mask it converts.
        self.dtype = model.model.embed_tokens.weight.dtype

    def add(self, rows: int, width: int, context: torch.Tensor, mask: torch.Tensor | None) -> None:
        length = context.shape[-1]
        shape = (rows, length, *self.kv_shape)
        group = AttentionGroup(len(self.ids), rows, width, self.offset, shape, mask)
        self.groups.append(group)
        self.contexts.append(context.reshape(-1))
        self.offset += rows * length

    def decodes(self, decodes: list[Sequence]) -> None:
        """One group for every decode: one query each, over its own context."""
        batch, positions = self.cache.build_batch(
            [s.block_table for s in decodes],
            [s.num_tokens - 1 for s in decodes],
            [1] * len(decodes),
        )
        length = batch.context_slots.shape[1]
        mask = batch.mask
        if self.window is not None and length > self.window:
            mask = sliding_window_mask(positions, length, self.window, mask)
        additive = None if mask is None else self._additive(mask)
        self.add(len(decodes), 1, batch.context_slots, additive)
        self.slots.append(batch.slot_mapping)
        self.positions.append(positions.view(-1))
        self.ids.extend(s.output_ids[-1] for s in decodes)

    def chunk(self, sequence: Sequence, count: int) -> None:
        """One group for a chunk: `count` queries, causal over its cached prefix and itself."""
        start = sequence.num_cached
        length = start + count
        table_slots = self.cache.table_slots(sequence.block_table)
        keys = self.cache.positions(length)
        positions = keys[start:]
        if self.window is not None and length > self.window:
            queries = positions.unsqueeze(1)
            mask = self._additive((keys <= queries) & (queries - keys < self.window))
        else:  # every key of the prefix, then the chunk's own causal triangle
            mask = F.pad(self.cache.causal_tail(count, self.dtype), (start, 0))
        self.add(1, count, table_slots[:length], mask)
        self.slots.append(table_slots[start:length])
        self.positions.append(positions)
        self.ids.extend(sequence.all_ids[start:length])

    def _additive(self, visible: torch.Tensor) -> torch.Tensor:
        """The additive mask SDPA would make of a bool one (0 where `visible`, -inf where
        not), made once for every layer instead of by each layer's attention."""
        zero, hidden = self.cache.mask_values(self.dtype)
        return torch.where(visible, zero, hidden)


def build_ragged(
    model: LlamaForCausalLM,
    cache: PagedKVCache,
    decodes: list[Sequence],
    chunks: list[tuple[Sequence, int]],
) -> tuple[torch.Tensor, torch.Tensor, RaggedBatch]:
    """The step's token ids [N], positions [N] and batch: the decodes first, in order, then
    each chunk's tokens."""
    layout = _Layout(model, cache)
    if decodes:
        layout.decodes(decodes)
    for sequence, count in chunks:
        layout.chunk(sequence, count)
    max_position = max(group.context[1] for group in layout.groups) - 1
    config = model.config
    gqa = config.num_attention_heads != config.num_key_value_heads
    contexts = _cat(layout.contexts)
    batch = RaggedBatch(_cat(layout.slots), contexts, layout.groups, max_position, gqa)
    input_ids = torch.tensor(layout.ids, dtype=torch.long).to(cache.device)
    return input_ids, _cat(layout.positions), batch


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


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
        input_ids, positions, batch = build_ragged(model, cache, decodes, chunks)
        # The decoder over the ragged batch: the last layer's hidden states [N, hidden], before
        # the final norm (`_logits` norms only the rows it wants logits of).
        inputs = model.layer_inputs(positions, batch)
        hidden = model.model.forward(input_ids, inputs, cache.keys, cache.values)
        for sequence in decodes:
            sequence.num_cached = sequence.num_tokens
        for sequence, count in chunks:
            sequence.num_cached += count
        return _logits(model, hidden, len(decodes), chunks)

    return forward


def _logits(
    model: LlamaForCausalLM, hidden: torch.Tensor, decodes: int, chunks: list[tuple[Sequence, int]]
) -> FusedLogits:
    """(decode logits, chunk logits) from the step's last hidden states: the final norm and the
    LM head over the decodes' rows, and each chunk's last row only if some chunk ends its
    prompt (zeros otherwise: nothing samples a chunk that does not)."""
    if not any(sequence.num_cached == sequence.num_tokens for sequence, _ in chunks):
        logits = model.logits(model.model.norm.forward(hidden[:decodes]))
        return logits, logits.new_zeros((len(chunks), logits.shape[1]))
    rows, end = list(range(decodes)), decodes
    for _, count in chunks:
        end += count
        rows.append(end - 1)
    index = torch.tensor(rows, device=hidden.device)
    logits = model.logits(model.model.norm.forward(hidden.index_select(0, index)))
    return logits[:decodes], logits[decodes:]
