"""Continuous-batching scheduler: priority admission under a token budget, preemption by recompute.

Each step the engine (1) reserves a cache slot for the next token of every running sequence,
preempting the least important running sequence when blocks run out, (2) admits waiting
sequences by priority (lower number first, FIFO within a priority) while the prefill token
budget, the batch size and the free blocks allow, and (3) decodes the running sequences.
A preempted sequence gives back all its blocks and waits again at the head of its priority;
when it is admitted again its prompt and the tokens generated so far are prefilled anew
(recompute), and its earlier output is not sent twice.

With prefix caching on, admission first looks up the sequence's full blocks in the cache:
hits join the block table (shared, reference counted) and prefill starts after them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.kv_cache import BlockAllocator, OutOfBlocks, blocks_needed, chain_hashes
from engine.sampling import SamplingParams
from engine.tokenizer import IncrementalDetokenizer


@dataclass(eq=False)
class Sequence:
    """One request inside the engine."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    priority: int
    arrival: int
    detokenizer: IncrementalDetokenizer
    deliver: Callable[[Any], None]
    generator: torch.Generator | None = None
    # False: the caller hears of the first token and of the end, nothing in between.
    streaming: bool = True
    output_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    num_cached: int = 0  # tokens whose keys and values are in the cache
    draft_cached: int = 0  # the same for the draft model's cache (speculative decoding)
    block_hashes: list[int] = field(default_factory=list)  # prefix hashes of full blocks
    prefix_hit_tokens: int = 0  # tokens found in the prefix cache at the last admission
    text: str = ""  # generated text so far
    sent_chars: int = 0  # how much of `text` has been handed to the caller
    sent_tokens: int = 0  # how many of `output_ids` have been handed to the caller
    finish_reason: str | None = None
    num_preemptions: int = 0

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def order(self) -> tuple[int, int]:
        return (self.priority, self.arrival)

    def lookahead(self, num_speculative: int) -> int:
        """Draft tokens worth proposing: never past max_tokens (the last slot is the bonus)."""
        remaining = self.params.max_tokens - len(self.output_ids)
        return max(0, min(num_speculative, remaining - 1))


class Scheduler:
    """Owns the waiting queue, the running set and the block allocator. Worker thread only."""

    def __init__(
        self,
        allocator: BlockAllocator,
        block_size: int,
        max_batch_size: int,
        max_prefill_tokens: int,
        num_speculative: int = 0,
    ) -> None:
        self.allocator = allocator
        self.num_speculative = num_speculative
        self.block_size = block_size
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self._waiting: list[tuple[int, int, Sequence]] = []
        self.running: list[Sequence] = []
        self.num_preempted_total = 0

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def waiting_by_priority(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for priority, _, _ in self._waiting:
            counts[priority] = counts.get(priority, 0) + 1
        return counts

    def has_work(self) -> bool:
        return bool(self._waiting or self.running)

    def add(self, sequence: Sequence) -> None:
        heapq.heappush(self._waiting, (sequence.priority, sequence.arrival, sequence))

    def remove(self, sequence: Sequence) -> None:
        """Take a sequence out wherever it is and give its blocks back."""
        if sequence in self.running:
            self.running.remove(sequence)
        else:
            entries = [entry for entry in self._waiting if entry[2] is not sequence]
            if len(entries) != len(self._waiting):
                self._waiting = entries
                heapq.heapify(self._waiting)
        self._release(sequence)

    def all_sequences(self) -> list[Sequence]:
        return self.running + [entry[2] for entry in self._waiting]

    def reserve_decode_slots(self) -> list[Sequence]:
        """Make room for the next token (and any draft tokens to verify) of every running
        sequence; returns those preempted."""
        preempted: list[Sequence] = []
        for sequence in sorted(self.running, key=lambda s: s.order):
            if sequence not in self.running:
                continue  # preempted earlier in this loop
            needed = sequence.num_tokens + sequence.lookahead(self.num_speculative)
            while True:
                try:
                    self._grow(sequence, needed)
                    break
                except OutOfBlocks:
                    victim = max(self.running, key=lambda s: s.order)
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is sequence:
                        break
        return preempted

    def admit(self) -> list[Sequence]:
        """Move waiting sequences into the running set; they need a prefill this step."""
        admitted: list[Sequence] = []
        budget = self.max_prefill_tokens
        while self._waiting and len(self.running) < self.max_batch_size:
            sequence = self._waiting[0][2]
            tokens = sequence.num_tokens
            hashes, hit = self._cached_prefix(sequence)
            to_compute = tokens - len(hit) * self.block_size
            if admitted and to_compute > budget:
                break
            # Room for the prompt and the first generated token; cached blocks nobody holds
            # count as free until this sequence takes them.
            reclaimed = sum(1 for block in hit if self.allocator.ref_count(block) == 0)
            new_blocks = blocks_needed(tokens + 1, self.block_size) - len(hit)
            if new_blocks > self.allocator.num_free - reclaimed:
                break
            heapq.heappop(self._waiting)
            self.allocator.acquire(hit)
            sequence.block_table = list(hit)
            sequence.block_hashes = hashes[: len(hit)]
            sequence.num_cached = sequence.draft_cached = len(hit) * self.block_size
            sequence.prefix_hit_tokens = sequence.num_cached
            self._grow(sequence, tokens)
            self.running.append(sequence)
            admitted.append(sequence)
            budget -= to_compute
        return admitted

    def _cached_prefix(self, sequence: Sequence) -> tuple[list[int], list[int]]:
        """Hashes of the sequence's full blocks and the cached blocks of its longest prefix.

        At least the last token is always computed: its logits pick the next token.
        """
        if not self.allocator.enable_caching:
            return [], []
        full = (sequence.num_tokens - 1) // self.block_size
        hashes = chain_hashes(sequence.all_ids, self.block_size, full)
        return hashes, self.allocator.lookup(hashes)

    def register_computed(self, sequence: Sequence, num_valid: int) -> None:
        """Offer the sequence's newly completed blocks (first `num_valid` tokens) to the cache."""
        full = num_valid // self.block_size
        if self.allocator.enable_caching and full > len(sequence.block_hashes):
            start = len(sequence.block_hashes)
            sequence.block_hashes = chain_hashes(
                sequence.all_ids, self.block_size, full, sequence.block_hashes
            )
            for index in range(start, full):
                self.allocator.register(sequence.block_table[index], sequence.block_hashes[index])

    def finish(self, sequence: Sequence) -> None:
        if sequence in self.running:
            self.running.remove(sequence)
        self._release(sequence)

    def _grow(self, sequence: Sequence, num_tokens: int) -> None:
        while len(sequence.block_table) * self.block_size < num_tokens:
            sequence.block_table.append(self.allocator.allocate())

    def _preempt(self, sequence: Sequence) -> None:
        self.running.remove(sequence)
        self._release(sequence)
        sequence.num_preemptions += 1
        self.num_preempted_total += 1
        self.add(sequence)

    def _release(self, sequence: Sequence) -> None:
        if sequence.block_table:
            self.allocator.free(sequence.block_table)
            sequence.block_table = []
        sequence.block_hashes = []
        sequence.num_cached = sequence.draft_cached = 0
