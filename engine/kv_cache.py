"""Paged KV cache: fixed-size blocks, block tables, free-block accounting, a prefix cache.

Blocks are handed out per sequence (its block table) with exact free-block accounting; with
prefix caching on, full blocks are shared across requests."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

from engine.attention import AttentionBatch
from engine.config import ModelConfig

# Entries kept by each of the cache's between-step memos (block tables' slots, causal tails):
# a few recur every step; past this many, the old ones belong to finished sequences.
KEPT_PER_STEP_CACHE = 16


class OutOfBlocks(RuntimeError):
    """No free KV-cache block is left; the scheduler preempts a sequence and retries."""


class BlockAllocator:
    """Hands out block ids with reference counts, and optionally keeps a prefix cache.

    Every block is in exactly one state: free (on the free stack), in use (reference count
    >= 1; a prefix-cached block can be shared by several sequences), or cached and evictable
    (reference count 0 but still holding the keys and values of a registered prefix). Free and
    evictable blocks both count as available (`num_free`): `allocate` takes a free block first
    and evicts the least recently released cached block only when none is left.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = False) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_kv_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        # A stack: the most recently freed block is reused first (warm in cache).
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, int] = {}  # registered block -> prefix hash
        self._block_of: dict[int, int] = {}  # prefix hash -> registered block
        self._evictable: OrderedDict[int, None] = OrderedDict()  # least recently released first
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._evictable)

    @property
    def num_cached(self) -> int:
        """Blocks registered in the prefix cache (in use or evictable)."""
        return len(self._hash_of)

    def ref_count(self, block: int) -> int:
        return self._refs[block]

    def allocate(self) -> int:
        if self._free:
            block = self._free.pop()
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)
            del self._block_of[self._hash_of.pop(block)]
            self.num_evictions += 1
        else:
            raise OutOfBlocks("no free KV-cache block")
        self._refs[block] = 1
        return block

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each block. Released in reverse so that, of a sequence's
        cached chain, the tail is evicted before the head (a head without its tail still
        serves shorter shared prefixes; a tail without its head serves nothing)."""
        for block in reversed(blocks):
            if self._refs[block] <= 0:
                raise RuntimeError(f"KV-cache block {block} freed twice")
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if block in self._hash_of:
                    self._evictable[block] = None
                else:
                    self._free.append(block)

    # ------------------------------------------------------------------ prefix cache
    def lookup(self, hashes: Sequence[int]) -> list[int]:
        """Blocks holding the longest cached prefix of a chain of block hashes (not acquired)."""
        blocks = []
        for prefix_hash in hashes:
            block = self._block_of.get(prefix_hash)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def acquire(self, blocks: Sequence[int]) -> None:
        """Take a reference to cached blocks found by `lookup`."""
        for block in blocks:
            if self._refs[block] == 0:
                del self._evictable[block]
            self._refs[block] += 1

    def register(self, block: int, prefix_hash: int) -> None:
        """Offer a full, computed block to the cache under the hash of its whole prefix."""
        if not self.enable_caching or prefix_hash in self._block_of or block in self._hash_of:
            return  # another block already holds this prefix: this one stays private
        self._hash_of[block] = prefix_hash
        self._block_of[prefix_hash] = block

    def check(self) -> None:
        """Assert the accounting invariant (tests): each block in exactly one state."""
        free = set(self._free)
        evictable = set(self._evictable)
        used = {b for b in range(self.num_blocks) if self._refs[b] > 0}
        assert len(free) == len(self._free), "a block is on the free stack twice"
        assert not (free & evictable) and not (free & used) and not (evictable & used)
        assert len(free) + len(evictable) + len(used) == self.num_blocks, "a block is lost"
        assert evictable <= set(self._hash_of), "an evictable block is not cached"
        assert free.isdisjoint(self._hash_of), "a free block is still registered"


def chain_hashes(
    token_ids: Sequence[int], block_size: int, num_blocks: int, parents: Sequence[int] = ()
) -> list[int]:
    """Hashes of the first `num_blocks` full blocks, each over its parent's hash and its tokens,
    so equal hashes mean equal whole prefixes. Extends `parents` (hashes already known)."""
    hashes = list(parents)
    for index in range(len(hashes), num_blocks):
        tokens = tuple(token_ids[index * block_size : (index + 1) * block_size])
        hashes.append(hash((hashes[-1] if hashes else None, tokens)))
    return hashes


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
        enable_caching: bool = False,
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
        self.allocator = BlockAllocator(num_blocks, enable_caching)
        self._offsets: tuple[torch.Tensor, torch.Tensor] | None = None
        # The slots of a few whole block tables (a sequence decoding alone, the sequences
        # prefilled a chunk at a time), kept between steps: a table changes every block_size
        # tokens, a step only slices.
        self._table_slots: dict[tuple[int, ...], torch.Tensor] = {}
        self._positions = torch.arange(0, dtype=torch.long, device=device)
        self._tails: dict[tuple[int, torch.dtype], torch.Tensor] = {}
        self._mask_values: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        element = torch.tensor([], dtype=dtype).element_size()
        per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
        return per_token * block_size * element

    def ensure_capacity(self, block_table: list[int], num_tokens: int) -> None:
        """Grow a sequence's block table to hold `num_tokens`; raises OutOfBlocks."""
        while len(block_table) * self.block_size < num_tokens:
            block_table.append(self.allocator.allocate())

    def _key_offsets(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(position // block_size, position % block_size) for positions 0..length-1, cached."""
        if self._offsets is None or self._offsets[0].shape[0] < length:
            size = max(
                length, 2 * (0 if self._offsets is None else self._offsets[0].shape[0]), 1024
            )
            positions = torch.arange(size)
            self._offsets = (positions // self.block_size, positions % self.block_size)
        return self._offsets[0][:length], self._offsets[1][:length]

    def table_slots(self, block_table: Sequence[int]) -> torch.Tensor:
        """The cache slot of every position `block_table` covers [blocks * block_size], on the
        cache's device; computed when the table changes, kept for the next steps."""
        table = tuple(block_table)
        slots = self._table_slots.get(table)
        if slots is None:
            if len(self._table_slots) >= KEPT_PER_STEP_CACHE:  # finished sequences': start afresh
                self._table_slots.clear()
            bs = self.block_size
            blocks = torch.tensor(table, dtype=torch.long)
            slots = (blocks.unsqueeze(1) * bs + torch.arange(bs)).view(-1).to(self.device)
            self._table_slots[table] = slots
        return slots

    def positions(self, stop: int) -> torch.Tensor:
        """0..stop-1 [stop] on the cache's device: a view of a range kept between steps."""
        if self._positions.shape[0] < stop:
            size = max(stop, 2 * self._positions.shape[0], 1024)
            self._positions = torch.arange(size, dtype=torch.long, device=self.device)
        return self._positions[:stop]

    def causal_tail(self, count: int, dtype: torch.dtype) -> torch.Tensor:
        """The additive causal mask of `count` new tokens over themselves [count, count]: 0 on
        and below the diagonal, -inf above; kept, a chunk size recurs every step."""
        tail = self._tails.get((count, dtype))
        if tail is None:
            if len(self._tails) >= KEPT_PER_STEP_CACHE:
                self._tails.clear()
            tail = torch.full((count, count), float("-inf"), dtype=dtype, device=self.device)
            tail = self._tails[(count, dtype)] = tail.triu(1)
        return tail

    def mask_values(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """0 and -inf as 0-dim tensors of `dtype` on the cache's device (additive masks)."""
        values = self._mask_values.get(dtype)
        if values is None:
            row = self.causal_tail(2, dtype)[0]  # [0, -inf]
            values = self._mask_values[dtype] = (row[0], row[1])
        return values

    def _single_decode_batch(
        self, block_table: Sequence[int], position: int
    ) -> tuple[AttentionBatch, torch.Tensor]:
        """One sequence adding one token: views into tensors kept between steps."""
        slots = self.table_slots(block_table)
        batch = AttentionBatch(
            token_index=None,
            slot_mapping=slots[position : position + 1],
            context_slots=slots[: position + 1].view(1, position + 1),
            mask=None,
        )
        return batch, self.positions(position + 1)[position:].view(1, 1)

    def _decode_batch(
        self, block_tables: Sequence[Sequence[int]], start_positions: Sequence[int]
    ) -> tuple[AttentionBatch, torch.Tensor]:
        """The one-new-token-per-sequence case, with few tensor ops: it runs every decode step."""
        bs = self.block_size
        context = max(start_positions) + 1
        width = blocks_needed(context, bs)
        rows = [
            list(blocks[:width]) + [0] * (width - min(len(blocks), width))
            for blocks in block_tables
        ]
        block_index, block_offset = self._key_offsets(context)
        context_slots = torch.tensor(rows, dtype=torch.long)[:, block_index] * bs + block_offset
        slots = [
            blocks[p // bs] * bs + p % bs
            for blocks, p in zip(block_tables, start_positions, strict=True)
        ]
        positions = torch.tensor(start_positions, dtype=torch.long).unsqueeze(1)
        mask = None
        if len(block_tables) > 1:  # shorter sequences must not see the padding keys
            key_positions = torch.arange(context)
            mask = (key_positions.unsqueeze(0) <= positions).view(len(block_tables), 1, 1, context)
            mask = mask.to(self.device)
        device = self.device
        batch = AttentionBatch(
            token_index=None,
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
            context_slots=context_slots.to(device),
            mask=mask,
        )
        return batch, positions.to(device)

    def build_batch(
        self,
        block_tables: Sequence[Sequence[int]],
        start_positions: Sequence[int],
        num_new_tokens: Sequence[int],
    ) -> tuple[AttentionBatch, torch.Tensor]:
        """Slots and masks for sequences adding `num_new_tokens[i]` at `start_positions[i]`.

        Returns the batch and the positions tensor [B, T] (padding positions are 0).
        """
        if len(block_tables) == 1 and num_new_tokens[0] == 1:
            return self._single_decode_batch(block_tables[0], start_positions[0])
        if all(new == 1 for new in num_new_tokens):
            return self._decode_batch(block_tables, start_positions)
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
