"""`fifo`: arrival order; a waiting request never preempts a running one."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from engine.policies.base import OrderingPolicy, PolicySettings

if TYPE_CHECKING:
    from engine.sequence import Sequence


class FifoPolicy(OrderingPolicy):
    """First come, first served: tiers are ignored, nobody is evicted for a newcomer."""

    name: ClassVar[str] = "fifo"
    help: ClassVar[str] = "arrival order"
    promise: ClassVar[str] = (
        "arrival order for every tier; nothing is preempted or shed for a newcomer"
    )

    def __init__(self, settings: PolicySettings | None = None) -> None:
        pass  # nothing to configure; the uniform signature lets one map build every policy

    def rank(self, sequence: Sequence, now_ns: int, tokens_per_step: int) -> tuple[float, int, int]:
        return (0.0, 0, sequence.arrival)

    def victim_key(self, sequence: Sequence) -> tuple[int, int]:
        # Out of blocks, the newest running sequence gives its blocks back first.
        return (0, sequence.arrival)

    def may_preempt(self, waiting: Sequence, running: Sequence) -> bool:
        return False
