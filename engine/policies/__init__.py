"""Scheduling policies: who prefills first, who may preempt whom, and when a request is shed.

- `fifo` (fifo.py): arrival order; a waiting request never preempts a running one.
- `priority` (priority.py): tiers in priority order with aging; a waiting higher tier
  preempts a lower one.
- `slo` (slo.py): by slack to each tier's TTFT objective, shedding what cannot make it, with
  steps shaped to the TPOT objective of the tiers that have one.

Each is one class behind `SchedulingPolicy` (base.py), chosen once by name (`create_policy`,
as vLLM's `create_request_queue`); `POLICIES` is the one list of names: `EngineConfig`, the
CLI's `--scheduling` and the docs follow it (tests/unit/test_policies.py checks the copies).
"""

from __future__ import annotations

from engine.policies.base import (
    SHED_QUEUE_FULL,
    SHED_REASONS,
    SHED_TTFT_OUT_OF_REACH,
    OrderingPolicy,
    PolicySettings,
    SchedulingPolicy,
    StepShape,
    TierObjective,
)
from engine.policies.fifo import FifoPolicy
from engine.policies.prefill_time import PrefillTimeModel
from engine.policies.priority import PriorityPolicy
from engine.policies.slo import SloPolicy

POLICIES: dict[str, type[FifoPolicy | PriorityPolicy | SloPolicy]] = {
    policy.name: policy for policy in (FifoPolicy, PriorityPolicy, SloPolicy)
}
POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)


def create_policy(
    name: str = "priority",
    *,
    aging_s: float | None = 2.0,
    objectives: dict[int, TierObjective] | None = None,
    default_ttft_s: float = 30.0,
    fused_steps: bool = False,
) -> SchedulingPolicy:
    """The policy called `name`, configured once; the scheduler then only calls it."""
    policy = POLICIES.get(name)
    if policy is None:
        raise ValueError(
            f"scheduling policy {name!r} is unknown; use one of {', '.join(POLICY_NAMES)}"
        )
    return policy(PolicySettings(aging_s, dict(objectives or {}), default_ttft_s, fused_steps))


__all__ = [
    "POLICIES",
    "POLICY_NAMES",
    "SHED_QUEUE_FULL",
    "SHED_REASONS",
    "SHED_TTFT_OUT_OF_REACH",
    "FifoPolicy",
    "OrderingPolicy",
    "PolicySettings",
    "PrefillTimeModel",
    "PriorityPolicy",
    "SchedulingPolicy",
    "SloPolicy",
    "StepShape",
    "TierObjective",
    "create_policy",
]
