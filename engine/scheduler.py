"""Continuous-batching scheduler: stall-free steps under a token budget, preemption by recompute.

Each step (`schedule`) the scheduler (1) sheds the waiting requests the policy gives up on (the
`slo` policy: those whose TTFT objective is out of reach), (2) reserves a cache slot for the next
token of every decoding sequence, preempting the least important running sequence when blocks run
out, and (3) fills the rest of the step's token budget (`max_num_batched_tokens`) with prefill
chunks in the policy's order (engine/policies/): prompts still being prefilled continue, waiting
ones are admitted while the batch size and the free blocks allow; a waiting request of a higher tier
may preempt a running one of a lower tier. Decodes go first, so a long prompt spans several steps
instead of stalling every running decode (Sarathi-Serve's stall-free batching).

A preempted sequence gives back all its blocks and waits again; when it is admitted again its
prompt and the tokens generated so far are prefilled anew (recompute), and its earlier output
is not sent twice.

With prefix caching on, admission first looks up the sequence's full blocks in the cache:
hits join the block table (shared, reference counted) and prefill starts after them.

With blame on (the default), the scheduler tells its `BlameLedger` (engine/blame.py) who was
planned, admitted, preempted for whom and shed, and how long each step took: each request's
blame, who made it wait, is final when the worker closes it (`close_blame`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.blame import BlameLedger, RequestBlame
from engine.kv_cache import BlockAllocator, OutOfBlocks, blocks_needed, chain_hashes
from engine.policies import SchedulingPolicy, TierObjective, create_policy
from engine.sequence import Sequence

if TYPE_CHECKING:
    from engine.config import EngineConfig

__all__ = ["Scheduler", "StepPlan"]


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
    planned_ns: int = 0  # the plan instant: the admitted were scheduled then

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
        policy: SchedulingPolicy | None = None,
        blame: bool = True,
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
        # Chosen once, by whoever builds the scheduler; from here on only its protocol is used.
        self.policy: SchedulingPolicy = policy or create_policy("priority")
        self._waiting: list[Sequence] = []  # in arrival order; the policy orders it per step
        self.running: list[Sequence] = []
        self.num_preempted_total = 0
        self._steps = 0
        self.blame = BlameLedger(num_speculative) if blame else None

    @classmethod
    def from_config(
        cls, config: EngineConfig, allocator: BlockAllocator, num_speculative: int = 0
    ) -> Scheduler:
        """The scheduler an engine runs with `config`: its limits, and its policy chosen by
        name here, once (the tiers' objectives in seconds, by priority)."""
        policy = create_policy(
            config.scheduling,
            aging_s=config.priority_aging_s,
            objectives={
                priority: TierObjective(ttft_s, tpot_s)
                for priority, (ttft_s, tpot_s) in config.tier_objectives.items()
            },
            fused_steps=config.fuse_steps and not num_speculative,
        )
        return cls(
            allocator,
            config.block_size,
            config.max_batch_size,
            config.max_num_batched_tokens or config.max_prefill_tokens,
            num_speculative=num_speculative,
            policy=policy,
            blame=config.blame,
        )

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
        if self.blame is not None:
            self.blame.joined(sequence)

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
    def schedule(self, now_ns: int, started_ns: int | None = None) -> StepPlan:
        """Plan one step at time `now_ns` (perf_counter_ns; injected so tests need no clock);
        `started_ns`: when the step began (its decodes' time counts from it; default now)."""
        plan = StepPlan(budget=self.max_num_batched_tokens, planned_ns=now_ns)
        blame = self.blame
        if blame is not None:
            blame.plan_started(now_ns, now_ns if started_ns is None else started_ns)
        for sequence, reason in self.policy.shed(
            self._waiting, self.running, now_ns, self._tokens_per_step()
        ):
            self._waiting.remove(sequence)
            plan.shed.append((sequence, reason))
            if blame is not None:
                blame.wait_ended(sequence, now_ns)
        self._reserve_decode_slots(now_ns, plan)
        self._steps += 1
        decoding = [s for s in self.running if s.prefilled]
        prefilling = [s for s in self.running if not s.prefilled]
        shape = self.policy.shape_step(decoding, prefilling, self._waiting, now_ns, self._steps)
        plan.tpot_s, plan.decodes = shape.tpot_s, shape.decodes
        plan.waiting_decodes = len(decoding) - len(plan.decodes)
        if self.num_speculative:
            plan.budget -= sum(1 + s.lookahead(self.num_speculative) for s in plan.decodes)
        else:
            plan.budget -= len(plan.decodes)
        if shape.prefill_cap is not None:
            plan.budget = min(plan.budget, shape.prefill_cap)
        self._fill_prefill(now_ns, plan)
        if blame is not None:
            blame.planned(plan)
        return plan

    def step_finished(self, plan: StepPlan, step_s: float, finished_ns: int | None = None) -> None:
        """The step planned as `plan` ran in `step_s` seconds, ending at `finished_ns`: the
        policy learns from it if it did any work (an idle step says nothing about the cost of
        prefill or decode), and so does the blame."""
        if self.blame is not None:
            self.blame.step_finished(plan, step_s, finished_ns, idle=not self.has_work())
        if plan.chunks or plan.decodes:
            self.policy.after_step(
                step_s,
                plan.tpot_s,
                plan.decodes,
                self.max_num_batched_tokens,
                plan.waiting_decodes,
                prefill_tokens=plan.prefill_tokens,
            )

    def _tokens_per_step(self) -> int:
        decoding = sum(1 for s in self.running if s.prefilled)
        return max(1, self.max_num_batched_tokens - decoding)

    def _prefill_order(self, now_ns: int) -> list[Sequence]:
        """Running sequences still prefilling and waiting ones, in the policy's order."""
        per_step = self._tokens_per_step()
        work = [s for s in self.running if not s.prefilled] + self._waiting
        return sorted(work, key=lambda s: self.policy.rank(s, now_ns, per_step))

    def _reserve_decode_slots(self, now_ns: int, plan: StepPlan) -> None:
        """Make room for the next token (and any draft tokens to verify) of every decoding
        sequence, preempting the policy's least important running sequence when blocks run out."""
        victim_key = self.policy.victim_key
        spec, size = self.num_speculative, self.block_size
        # Most steps every decoding sequence already has room for its next token, or the free
        # blocks cover all that lack it: then nobody is preempted and only those grow (in the
        # same order as below, so the same blocks go to the same sequences). Without speculation
        # nothing is looked ahead (lookahead(0) is 0): no call per running sequence per step.
        short = [
            (s, needed)
            for s in self.running
            if s.prefilled
            and len(s.block_table) * size
            < (needed := s.num_tokens + (s.lookahead(spec) if spec else 0))
        ]
        if not short:
            return
        missing = sum(blocks_needed(needed, size) - len(s.block_table) for s, needed in short)
        if missing <= self.allocator.num_free:
            for sequence, needed in sorted(short, key=lambda pair: victim_key(pair[0])):
                self._grow(sequence, needed)
            return
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
                    self._preempt(victim, now_ns, sequence)
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
            self._preempt(victim, now_ns, sequence)
            plan.preempted.append(victim)
            if victim in plan.decodes:
                plan.decodes.remove(victim)
                plan.budget += 1 + victim.lookahead(self.num_speculative)
        self._waiting.remove(sequence)
        if self.blame is not None:
            self.blame.wait_ended(sequence, now_ns)
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

    def close_blame(self, sequence: Sequence, now_ns: int) -> RequestBlame | None:
        """Who made the request that ended at `now_ns` wait (None with blame off)."""
        return None if self.blame is None else self.blame.close(sequence, now_ns)

    def _grow(self, sequence: Sequence, num_tokens: int) -> None:
        while len(sequence.block_table) * self.block_size < num_tokens:
            sequence.block_table.append(self.allocator.allocate())

    def _preempt(self, sequence: Sequence, now_ns: int, for_sequence: Sequence) -> None:
        """Preempt `sequence` at `now_ns` to make room for `for_sequence`."""
        if self.blame is not None:
            self.blame.preempted(sequence, for_sequence, now_ns)
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
