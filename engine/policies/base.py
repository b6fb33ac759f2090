"""The protocol every scheduling policy implements, and what the policies share.

The scheduler (engine/scheduler.py) owns the queues, the blocks and the step's budget; a
policy only answers its questions: in what order prefill work goes (`rank`), who may evict
whom (`may_preempt`, `victim_key`), which waiting requests to give up on (`shed`), how to
shape a step (`shape_step`, `holds_prefill`, `note_prefill`) and what to learn once it ran
(`after_step`). A policy that has nothing to say about a question answers with the neutral
value (the protocol's own answers, which `OrderingPolicy` inherits), so the scheduler never
asks which policy it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from engine.sequence import Sequence

# Why a request was refused with a 429 (`RequestShed`, `StepStats.shed`): the slo policy's
# deadline check, or the waiting queue's bound at submit. slo.sli.SHED_REASONS restates it
# (the core imports no engine); tests/unit/engine/test_policies.py fails when the two disagree.
SHED_TTFT_OUT_OF_REACH = "ttft_out_of_reach"
SHED_QUEUE_FULL = "queue_full"
SHED_REASONS: tuple[str, ...] = (SHED_TTFT_OUT_OF_REACH, SHED_QUEUE_FULL)

# Which specs a policy runs for when none is named (`default_for`; one policy each): those
# that set a TTFT or TPOT objective on some tier, and those that set none.
WITH_OBJECTIVES = "with objectives"
WITHOUT_OBJECTIVES = "without objectives"


@dataclass(frozen=True, slots=True)
class TierObjective:
    """A tier's latency objectives as the scheduler needs them (seconds; None: no objective)."""

    ttft_s: float | None = None
    tpot_s: float | None = None


@dataclass(frozen=True, slots=True)
class PolicySettings:
    """Everything any policy is configured with; each class reads the fields it needs."""

    # priority: every `aging_s` seconds of waiting moves a request up one level (None: never).
    aging_s: float | None = 2.0
    objectives: dict[int, TierObjective] = field(default_factory=dict)  # slo: by priority
    default_ttft_s: float = 30.0  # slo: the deadline of a tier without a TTFT objective
    # slo: the engine runs a step's decodes and chunks in one forward (engine/fused.py).
    fused_steps: bool = False


@dataclass(slots=True)
class StepShape:
    """What a policy makes of the step being planned: the TPOT it must fit (None: none), the
    decodes it runs, and the most prefill tokens it may take (None: the whole budget)."""

    tpot_s: float | None
    decodes: list[Sequence]
    prefill_cap: int | None = None


class PolicyClass(Protocol):
    """A policy's class as `create_policy` and the CLI read it, without torch (`slo --help`
    is built from these): what the policy is called and says of itself, and how it is made."""

    name: str
    # What the policy promises, in one sentence (shown in /health, the docs restate it).
    promise: str
    help: str  # its line in `--scheduling`'s help, after "name: "
    # Whether it schedules by the tiers' objectives (`PolicySettings.objectives`): `slo serve`
    # then reads them from the spec, and refuses a spec that sets none.
    reads_objectives: bool
    default_for: str | None  # WITH_OBJECTIVES, WITHOUT_OBJECTIVES or None: only when named

    def __call__(self, settings: PolicySettings | None = None) -> SchedulingPolicy: ...


@runtime_checkable
class SchedulingPolicy(Protocol):
    """What the scheduler asks of a policy; nothing else of one is ever called. Where a
    question has a neutral answer (shed nothing, leave the step as planned, hold no prefill,
    learn nothing), the method gives it: a class that subclasses this one inherits them."""

    name: ClassVar[str]
    promise: ClassVar[str]  # see PolicyClass

    def rank(self, sequence: Sequence, now_ns: int, tokens_per_step: int) -> tuple[float, int, int]:
        """Sort key of prefill work: smaller goes first."""
        ...

    def victim_key(self, sequence: Sequence) -> tuple[int, int]:
        """The running sequence with the largest key is preempted first."""
        ...

    def may_preempt(self, waiting: Sequence, running: Sequence) -> bool:
        """Whether `waiting` may evict `running` to get a batch slot or blocks."""
        ...

    def shed(
        self, waiting: list[Sequence], running: list[Sequence], now_ns: int, tokens_per_step: int
    ) -> list[tuple[Sequence, str]]:
        """Waiting sequences to refuse now, each with its reason, in the order given up on."""
        return []

    def shape_step(
        self,
        decoding: list[Sequence],
        prefilling: list[Sequence],
        waiting: list[Sequence],
        now_ns: int,
        step: int,
    ) -> StepShape:
        """The step's TPOT bound, decodes and prefill cap; `step` numbers the steps."""
        return StepShape(None, decoding)

    def holds_prefill(self, sequence: Sequence, now_ns: int) -> bool:
        """Whether `sequence`'s prefill waits in the step planned now."""
        return False

    def note_prefill(self, sequence: Sequence) -> None:
        """A prefill chunk of `sequence` was planned in this step."""
        return None

    def after_step(
        self,
        step_s: float,
        tpot_s: float | None,
        decoding: list[Sequence],
        budget: int,
        waiting_decodes: int,
        *,
        prefill_tokens: int | None = None,
    ) -> None:
        """A step that did work took `step_s`: it prefilled `prefill_tokens` (None: not
        known), decoded `decoding` under the bound `tpot_s`, and left `waiting_decodes`
        decoding sequences out; `budget` is the step's full token budget."""
        return None


def by_tier_victim_key(sequence: Sequence) -> tuple[int, int]:
    """The lowest tier (largest priority number) goes first, the newest within it."""
    return (sequence.priority, sequence.arrival)


def by_tier_may_preempt(waiting: Sequence, running: Sequence) -> bool:
    """Only a strictly more important tier evicts: equal tiers never ping-pong."""
    return running.priority > waiting.priority


class OrderingPolicy(SchedulingPolicy):
    """A policy that only orders and preempts (its subclass defines `rank`, `victim_key` and
    `may_preempt`): it sheds nothing and leaves steps as planned, the protocol's answers."""

    reads_objectives: ClassVar[bool] = False
    default_for: ClassVar[str | None] = None
