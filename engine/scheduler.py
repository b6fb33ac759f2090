"""Continuous-batching scheduler: stall-free steps under a token budget, preemption by recompute.

Each step (`schedule`) the scheduler (1) sheds, under the `slo` policy, waiting requests whose
TTFT objective is out of reach, (2) reserves a cache slot for the next token of every decoding
sequence, preempting the least important running sequence when blocks run out, and (3) fills
the rest of the step's token budget (`max_num_batched_tokens`) with prefill chunks in the
policy's order (engine/policy.py): prompts still being prefilled continue, waiting ones are
admitted while the batch size and the free blocks allow; a waiting request of a higher tier
may preempt a running one of a lower tier. Decodes go first, so a long prompt spans several
steps instead of stalling every running decode (Sarathi-Serve's stall-free batching).

A preempted sequence gives back all its blocks and waits again; when it is admitted again its
prompt and the tokens generated so far are prefilled anew (recompute), and its earlier output
is not sent twice.

With prefix caching on, admission first looks up the sequence's full blocks in the cache:
hits join the block table (shared, reference counted) and prefill starts after them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.kv_cache import BlockAllocator, OutOfBlocks, blocks_needed, chain_hashes
from engine.policy import SHED_TTFT_OUT_OF_REACH, Policy
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
    arrival_ns: int = 0  # perf_counter_ns when enqueued: TTFT deadlines and aging count from it
    queued_ns: int = 0  # when it last joined the waiting queue (arrival, or its preemption)
    prefilled: bool = False  # every token up to the newest is in the cache: it decodes
    prefill_started: bool = False  # its first chunk since (re)admission has run
    last_decode_step: int = 0  # the scheduler step that last decoded it (slo: turns)

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


@dataclass
class StepPlan:
    """What one step runs: decodes first, then prefill chunks; and who was moved or shed."""

    budget: int  # tokens of the step's budget not yet handed out
    decodes: list[Sequence] = field(default_factory=list)
    chunks: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, tokens)
    admitted: list[Sequence] = field(default_factory=list)  # given blocks this step
    preempted: list[Sequence] = field(default_factory=list)
    shed: list[tuple[Sequence, str]] = field(default_factory=list)  # (sequence, reason)
    waiting_decodes: int = 0  # decoding sequences left out of this step (slo: taking turns)
    tpot_s: float | None = None  # slo: the TPOT objective this step must fit, if any

    @property
    def prefill_tokens(self) -> int:
        return sum(tokens for _, tokens in self.chunks)


class Scheduler:
    """Owns the waiting queue, the running set and the block allocator. Worker thread only."""

    def __init__(
        self,
        allocator: BlockAllocator,
        block_size: int,
        max_batch_size: int,
        max_num_batched_tokens: int,
        num_speculative: int = 0,
        policy: Policy | None = None,
    ) -> None:
        if max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be at least 1, got {max_num_batched_tokens}"
            )
        self.allocator = allocator
        self.num_speculative = num_speculative
        self.block_size = block_size
        self.max_batch_size = max_batch_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy or Policy()
        self._waiting: list[Sequence] = []  # in arrival order; the policy orders it per step
        self.running: list[Sequence] = []
        self.num_preempted_total = 0
        self._steps = 0

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def waiting_by_priority(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for sequence in self._waiting:
            counts[sequence.priority] = counts.get(sequence.priority, 0) + 1
        return counts

    def has_work(self) -> bool:
        return bool(self._waiting or self.running)

    def add(self, sequence: Sequence) -> None:
        if not sequence.queued_ns:
            sequence.queued_ns = sequence.arrival_ns
        self._waiting.append(sequence)

    def remove(self, sequence: Sequence) -> None:
        """Take a sequence out wherever it is and give its blocks back."""
        if sequence in self.running:
            self.running.remove(sequence)
        elif sequence in self._waiting:
            self._waiting.remove(sequence)
        self._release(sequence)

    def all_sequences(self) -> list[Sequence]:
        return self.running + self._waiting

    # ------------------------------------------------------------------------ one step
    def schedule(self, now_ns: int) -> StepPlan:
        """Plan one step at time `now_ns` (perf_counter_ns; injected so tests need no clock)."""
        plan = StepPlan(budget=self.max_num_batched_tokens)
        if self.policy.sheds:
            self._shed(now_ns, plan)
        self._reserve_decode_slots(now_ns, plan)
        self._steps += 1
        decoding = [s for s in self.running if s.prefilled]
        prefilling = [s for s in self.running if not s.prefilled]
        plan.tpot_s = self.policy.step_tpot_s([*decoding, *prefilling], self._waiting, now_ns)
        plan.decodes = self.policy.select_decodes(decoding, self._steps, plan.tpot_s)
        plan.waiting_decodes = len(decoding) - len(plan.decodes)
        plan.budget -= sum(1 + s.lookahead(self.num_speculative) for s in plan.decodes)
        cap = self.policy.prefill_cap(plan.tpot_s, now_ns)
        if cap is not None:
            plan.budget = min(plan.budget, cap)
        self._fill_prefill(now_ns, plan)
        return plan

    def _tokens_per_step(self) -> int:
        decoding = sum(1 for s in self.running if s.prefilled)
        return max(1, self.max_num_batched_tokens - decoding)

    def _prefill_order(self, now_ns: int) -> list[Sequence]:
        """Running sequences still prefilling and waiting ones, in the policy's order."""
        per_step = self._tokens_per_step()
        work = [s for s in self.running if not s.prefilled] + self._waiting
        return sorted(work, key=lambda s: self.policy.rank(s, now_ns, per_step))

    def _shed(self, now_ns: int, plan: StepPlan) -> None:
        """Drop waiting requests that can no longer meet their tier's TTFT objective.

        First those out of reach whatever the order: even prefilled next they would miss. Then the queue's depth: a request misses
        when now + the predicted time to prefill everything ordered before it, and itself,
        passes its deadline; the lowest tier among those that miss goes first, and the rest
        are judged again without it (it may have been in their way). Nothing is shed before
        the prefill-time model has seen enough steps, nor a request that has already streamed
        tokens (preempted and waiting again), nor one whose tier has no TTFT objective.
        """
        model, policy = self.policy.prefill_time, self.policy
        if not model.ready or not self._waiting:
            return
        per_step = self._tokens_per_step()

        def misses(ahead_ns: float, sequence: Sequence) -> bool:
            return now_ns + ahead_ns > policy.ttft_deadline_ns(sequence)

        eligible = [s for s in self._waiting if not s.output_ids and policy.has_ttft_objective(s)]
        for sequence in eligible:
            alone = model.predict_s(sequence.num_tokens, per_step) * 1e9
            if misses(alone, sequence):
                self._waiting.remove(sequence)
                plan.shed.append((sequence, SHED_TTFT_OUT_OF_REACH))
        candidates = {id(s) for s in eligible if s in self._waiting}
        order = self._prefill_order(now_ns)
        while candidates:
            ahead = 0
            missed: list[Sequence] = []
            for sequence in order:
                if sequence.finish_reason is None and (
                    sequence in self.running or sequence in self._waiting
                ):
                    ahead += sequence.num_tokens - sequence.num_cached
                    if id(sequence) in candidates and misses(
                        model.predict_s(ahead, per_step) * 1e9, sequence
                    ):
                        missed.append(sequence)
            if not missed:
                return
            lowest = max(s.priority for s in missed)
            for sequence in missed:
                if sequence.priority == lowest:
                    candidates.discard(id(sequence))
                    self._waiting.remove(sequence)
                    plan.shed.append((sequence, SHED_TTFT_OUT_OF_REACH))

    def _reserve_decode_slots(self, now_ns: int, plan: StepPlan) -> None:
        """Make room for the next token (and any draft tokens to verify) of every decoding
        sequence, preempting the policy's least important running sequence when blocks run out."""
        victim_key = self.policy.victim_key
        for sequence in sorted((s for s in self.running if s.prefilled), key=victim_key):
            if sequence not in self.running:
                continue  # preempted earlier in this loop
            needed = sequence.num_tokens + sequence.lookahead(self.num_speculative)
            while True:
                try:
                    self._grow(sequence, needed)
                    break
                except OutOfBlocks:
                    victim = max(self.running, key=victim_key)
                    self._preempt(victim, now_ns)
                    plan.preempted.append(victim)
                    if victim is sequence:
                        break

    def _fill_prefill(self, now_ns: int, plan: StepPlan) -> None:
        """Hand the budget left after the decodes to prefill chunks, in the policy's order."""
        preempted = {id(s) for s in plan.preempted}
        blocked = False  # a waiting request did not fit: no later one jumps ahead of it
        policy = self.policy
        for sequence in self._prefill_order(now_ns):
            if plan.budget <= 0:
                break
            if id(sequence) in preempted:
                continue
            if policy.holds_prefill(sequence, now_ns):
                policy.note_held(now_ns)
                continue
            if sequence not in self.running and (
                blocked or not self._admit(sequence, now_ns, plan)
            ):
                blocked = True
                continue
            chunk = min(sequence.num_tokens - sequence.num_cached, plan.budget)
            plan.chunks.append((sequence, chunk))
            plan.budget -= chunk
            policy.note_prefill(sequence)

    def _admit(self, sequence: Sequence, now_ns: int, plan: StepPlan) -> bool:
        """Give a waiting sequence its blocks and a batch slot, preempting lower tiers if the
        policy allows; False when it does not fit."""
        tokens = sequence.num_tokens
        while True:
            hashes, hit = self._cached_prefix(sequence)
            # Room for the prompt and the first generated token; cached blocks nobody holds
            # count as free until this sequence takes them.
            reclaimed = sum(1 for block in hit if self.allocator.ref_count(block) == 0)
            new_blocks = blocks_needed(tokens + 1, self.block_size) - len(hit)
            full = len(self.running) >= self.max_batch_size
            if not full and new_blocks <= self.allocator.num_free - reclaimed:
                break
            victim = self._victim_for(sequence, plan)
            if victim is None:
                return False
            self._preempt(victim, now_ns)
            plan.preempted.append(victim)
            if victim in plan.decodes:
                plan.decodes.remove(victim)
                plan.budget += 1 + victim.lookahead(self.num_speculative)
        self._waiting.remove(sequence)
        self.allocator.acquire(hit)
        sequence.block_table = list(hit)
        sequence.block_hashes = hashes[: len(hit)]
        sequence.num_cached = sequence.draft_cached = len(hit) * self.block_size
        sequence.prefix_hit_tokens = sequence.num_cached
        sequence.prefilled = sequence.prefill_started = False
        self._grow(sequence, tokens)
        self.running.append(sequence)
        plan.admitted.append(sequence)
        return True

    def _victim_for(self, waiting: Sequence, plan: StepPlan) -> Sequence | None:
        """The running sequence `waiting` may preempt: the policy's least important one of a
        lower tier, never one already given a prefill chunk this step."""
        chunked = {id(s) for s, _ in plan.chunks}
        candidates = [
            s for s in self.running if id(s) not in chunked and self.policy.may_preempt(waiting, s)
        ]
        return max(candidates, key=self.policy.victim_key) if candidates else None

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

    def _preempt(self, sequence: Sequence, now_ns: int) -> None:
        self.running.remove(sequence)
        self._release(sequence)
        sequence.num_preemptions += 1
        sequence.prefilled = sequence.prefill_started = False
        sequence.queued_ns = now_ns
        self.num_preempted_total += 1
        self._waiting.append(sequence)

    def _release(self, sequence: Sequence) -> None:
        if sequence.block_table:
            self.allocator.free(sequence.block_table)
            sequence.block_table = []
        sequence.block_hashes = []
        sequence.num_cached = sequence.draft_cached = 0
