"""`priority`: lower priority number first; with the batch or the KV cache full, a waiting
request preempts the lowest-priority running sequence (recompute).

Aging: every `aging_s` seconds of waiting moves a request up one level in the order, so the
lowest tier keeps progressing under a flood of higher tiers. Preemption still looks at the
raw priority only, so an aged request never evicts a better tier and nothing ping-pongs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from engine.policies.base import (
    WITHOUT_OBJECTIVES,
    OrderingPolicy,
    PolicySettings,
    by_tier_may_preempt,
    by_tier_victim_key,
)

if TYPE_CHECKING:
    from engine.sequence import Sequence


class PriorityPolicy(OrderingPolicy):
    """Tiers in priority order, with aging; a waiting higher tier preempts a lower one."""

    name: ClassVar[str] = "priority"
    help: ClassVar[str] = (
        "tiers in priority order, a waiting higher tier preempts a lower one, aging keeps the "
        "lowest moving"
    )
    default_for: ClassVar[str | None] = WITHOUT_OBJECTIVES
    promise: ClassVar[str] = (
        "a higher tier's prefill goes first and preempts a lower tier's; aging keeps the "
        "lowest moving; no latency objective is kept and nothing is shed"
    )

    def __init__(self, settings: PolicySettings | None = None) -> None:
        aging_s = (settings or PolicySettings()).aging_s
        self.aging_s = aging_s if aging_s and aging_s > 0 else None

    def rank(self, sequence: Sequence, now_ns: int, tokens_per_step: int) -> tuple[float, int, int]:
        aged = 0
        if self.aging_s is not None:
            aged = int((now_ns - sequence.arrival_ns) / 1e9 / self.aging_s)
        # Equal levels: the older request first, so aging really lets it through.
        return (float(sequence.priority - aged), 0, sequence.arrival)

    def victim_key(self, sequence: Sequence) -> tuple[int, int]:
        return by_tier_victim_key(sequence)

    def may_preempt(self, waiting: Sequence, running: Sequence) -> bool:
        return by_tier_may_preempt(waiting, running)
