"""Chunked prefill: the next `count` uncached tokens of each sequence in one batched forward.

`runner.prefill` computes every uncached token; under a step's token budget a long prompt is
computed a chunk at a time (keys and values of earlier chunks are read back from the cache),
so the same positions see the same keys and greedy output does not change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from engine.kv_cache import PagedKVCache
from engine.model import LlamaForCausalLM
from engine.sequence import Sequence

if TYPE_CHECKING:
    from engine.speculative import SpeculativeDecoder


def prefill_chunks(
    model: LlamaForCausalLM, cache: PagedKVCache, sequences: list[Sequence], counts: list[int]
) -> torch.Tensor:
    """Compute `counts[i]` tokens of sequence i from its first uncached one; returns the logits
    of each chunk's last token [B, vocab] (meaningful only where the chunk ends the prompt)."""
    starts = [s.num_cached for s in sequences]
    batch, positions = cache.build_batch([s.block_table for s in sequences], starts, counts)
    ids = torch.zeros((len(sequences), max(counts)), dtype=torch.long)
    for row, (sequence, start, count) in enumerate(zip(sequences, starts, counts, strict=True)):
        ids[row, :count] = torch.tensor(sequence.all_ids[start : start + count], dtype=torch.long)
    hidden = model(ids.to(cache.device), positions, cache.keys, cache.values, batch)
    last = torch.tensor([count - 1 for count in counts], device=hidden.device)
    last_hidden = hidden[torch.arange(len(sequences), device=hidden.device), last]
    for sequence, count in zip(sequences, counts, strict=True):
        sequence.num_cached += count
    return model.logits(last_hidden)


def chunk_forward(
    counts: list[int], speculative: SpeculativeDecoder | None
) -> Callable[[LlamaForCausalLM, PagedKVCache, list[Sequence]], torch.Tensor]:
    """The worker's forward for a step's chunks alone (the draft model's too, speculating)."""

    def forward(
        model: LlamaForCausalLM, cache: PagedKVCache, sequences: list[Sequence]
    ) -> torch.Tensor:
        logits = prefill_chunks(model, cache, sequences, counts)
        if speculative is not None:
            speculative.prefill(sequences)
        return logits

    return forward
