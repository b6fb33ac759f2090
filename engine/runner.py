"""The two forward passes of the engine: prefill (whole prompts) and decode (one token each).

Kept separate, as in gpt-fast, because they map one-to-one onto the prefill and decode
phases users see in their latency breakdown.
"""

from __future__ import annotations

import torch

from engine.kv_cache import PagedKVCache
from engine.model import LlamaForCausalLM
from engine.sequence import Sequence


def prefill(
    model: LlamaForCausalLM, cache: PagedKVCache, sequences: list[Sequence]
) -> torch.Tensor:
    """Run every uncached token of each sequence; returns logits of each last token [B, vocab]."""
    starts = [s.num_cached for s in sequences]
    new_counts = [s.num_tokens - s.num_cached for s in sequences]
    batch, positions = cache.build_batch([s.block_table for s in sequences], starts, new_counts)
    width = max(new_counts)
    ids = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, (sequence, start) in enumerate(zip(sequences, starts, strict=True)):
        pending = sequence.all_ids[start:]
        ids[row, : len(pending)] = torch.tensor(pending, dtype=torch.long)
    hidden = model(ids.to(cache.device), positions, cache.keys, cache.values, batch)
    last = torch.tensor([count - 1 for count in new_counts], device=hidden.device)
    last_hidden = hidden[torch.arange(len(sequences), device=hidden.device), last]
    for sequence in sequences:
        sequence.num_cached = sequence.num_tokens
    return model.logits(last_hidden)


def decode(model: LlamaForCausalLM, cache: PagedKVCache, sequences: list[Sequence]) -> torch.Tensor:
    """Feed the newest token of every sequence in one batched forward; returns [B, vocab]."""
    starts = [s.num_tokens - 1 for s in sequences]
    batch, positions = cache.build_batch(
        [s.block_table for s in sequences], starts, [1] * len(sequences)
    )
    ids = torch.tensor([[s.output_ids[-1]] for s in sequences], dtype=torch.long)
    compiled = model.compiled_forward
    if compiled is not None:  # forward and LM head in one graph
        logits = compiled(ids.to(cache.device), positions, cache.keys, cache.values, batch)
    else:
        hidden = model(ids.to(cache.device), positions, cache.keys, cache.values, batch)
        logits = model.logits(hidden[:, 0])
    for sequence in sequences:
        sequence.num_cached = sequence.num_tokens
    return logits


def run_tokens(
    model: LlamaForCausalLM,
    cache: PagedKVCache,
    block_tables: list[list[int]],
    starts: list[int],
    token_lists: list[list[int]],
) -> torch.Tensor:
    """Feed `token_lists[i]` at positions `starts[i]...`; returns logits [B, T, vocab].

    The general form of prefill and decode that speculative decoding needs: the draft feeds
    one or two tokens per sequence, the target verifies k+1 tokens per sequence. Rows shorter
    than T are padded; their padded logits are garbage and must be ignored.
    """
    counts = [len(tokens) for tokens in token_lists]
    batch, positions = cache.build_batch(block_tables, starts, counts)
    ids = torch.zeros((len(token_lists), max(counts)), dtype=torch.long)
    for row, tokens in enumerate(token_lists):
        ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    hidden = model(ids.to(cache.device), positions, cache.keys, cache.values, batch)
    return model.logits(hidden)
