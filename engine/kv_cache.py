"""Paged KV cache: fixed-size blocks, per-sequence block tables, exact free-block accounting."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.config import ModelConfig
from engine.model import AttentionBatch


class OutOfBlocks(RuntimeError):
    """No free KV-cache block is left; the scheduler preempts a sequence and retries."""


class BlockAllocator:
    """Hands out block ids; every block is either free or owned by exactly one sequence."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_kv_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        # A stack: the most recently freed block is reused first (warm in cache).
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._is_free = [True] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise OutOfBlocks("no free KV-cache block")
        block = self._free.pop()
        self._is_free[block] = False
        return block

    def free(self, blocks: Sequence[int]) -> None:
        for block in blocks:
            if self._is_free[block]:
                raise RuntimeError(f"KV-cache block {block} freed twice")
            self._is_free[block] = True
            self._free.append(block)


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class PagedKVCache:
    """Per-layer key and value tensors of shape [num_blocks * block_size, kv_heads, head_dim]."""

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = device
        shape = (num_blocks * block_size, config.num_key_value_heads, config.head_dim)
        self.keys = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)
        ]
        self.values = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)
        ]
        self.allocator = BlockAllocator(num_blocks)

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        element = torch.tensor([], dtype=dtype).element_size()
        per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
        return per_token * block_size * element

    def ensure_capacity(self, block_table: list[int], num_tokens: int) -> None:
        """Grow a sequence's block table to hold `num_tokens`; raises OutOfBlocks."""
        while len(block_table) * self.block_size < num_tokens:
            block_table.append(self.allocator.allocate())

    def build_batch(
        self,
        block_tables: Sequence[Sequence[int]],
        start_positions: Sequence[int],
        num_new_tokens: Sequence[int],
    ) -> tuple[AttentionBatch, torch.Tensor]:
        """Slots and masks for sequences adding `num_new_tokens[i]` at `start_positions[i]`.

        Returns the batch and the positions tensor [B, T] (padding positions are 0).
        """
        bsz = len(block_tables)
        max_new = max(num_new_tokens)
        context_lens = [
            start + new for start, new in zip(start_positions, num_new_tokens, strict=True)
        ]
        max_context = max(context_lens)
        max_blocks = blocks_needed(max_context, self.block_size)
        table = torch.tensor(
            [
                list(blocks[:max_blocks]) + [0] * (max_blocks - min(len(blocks), max_blocks))
                for blocks in block_tables
            ],
            dtype=torch.long,
        )
        steps = torch.arange(max_new)
        starts = torch.tensor(start_positions, dtype=torch.long)
        news = torch.tensor(num_new_tokens, dtype=torch.long)
        valid = steps.unsqueeze(0) < news.unsqueeze(1)
        positions = torch.where(valid, starts.unsqueeze(1) + steps.unsqueeze(0), 0)

        key_positions = torch.arange(max_context)
        context_slots = (
            table[:, key_positions // self.block_size] * self.block_size
            + key_positions % self.block_size
        )
        token_slots = torch.gather(context_slots, 1, positions)
        padded = min(num_new_tokens) != max_new
        token_index = valid.reshape(-1).nonzero().squeeze(1) if padded else None
        slot_mapping = token_slots[valid] if padded else token_slots.reshape(-1)
        mask = None
        if bsz > 1 or max_new > 1:
            lens = torch.tensor(context_lens, dtype=torch.long)
            mask = (key_positions.view(1, 1, -1) <= positions.unsqueeze(-1)) & (
                key_positions.view(1, 1, -1) < lens.view(-1, 1, 1)
            )
            mask = mask.unsqueeze(1).to(self.device)
        device = self.device
        batch = AttentionBatch(
            token_index=None if token_index is None else token_index.to(device),
            slot_mapping=slot_mapping.to(device),
            context_slots=context_slots.to(device),
            mask=mask,
        )
        return batch, positions.to(device)
