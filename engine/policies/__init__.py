"""Scheduling policies: who prefills first, who may preempt whom, and when a request is shed.

- `fifo` (fifo.py): arrival order; a waiting request never preempts a running one.
- `priority` (priority.py): tiers in priority order with aging; a waiting higher tier
  preempts a lower one.
- `slo` (slo.py): by slack to each tier's TTFT objective, shedding what cannot make it, with
  steps shaped to the TPOT objective of the tiers that have one.

Each is one class behind `SchedulingPolicy` (base.py), in a module of its own here, chosen
once by name (`create_policy`, as vLLM's `create_request_queue`). `POLICIES` finds them: every
class of this package's modules with a `name` of its own is a policy, so a new module is a new
policy, and `EngineConfig`, the CLI's `--scheduling` (its choices, help and which policy reads
the spec's objectives) and the error messages follow. Nothing here imports torch: the CLI
reads these to build `slo --help`.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from types import ModuleType
from typing import cast

from engine.policies.base import (
    SHED_QUEUE_FULL,
    SHED_REASONS,
    SHED_TTFT_OUT_OF_REACH,
    WITH_OBJECTIVES,
    WITHOUT_OBJECTIVES,
    OrderingPolicy,
    PolicyClass,
    PolicySettings,
    SchedulingPolicy,
    StepShape,
    TierObjective,
)
from engine.policies.prefill_time import PrefillTimeModel

# What a policy class describes itself with, beyond how it is made (`PolicyClass`).
_DESCRIBED = {"name": str, "promise": str, "help": str, "reads_objectives": bool}


def discover(package: ModuleType) -> dict[str, PolicyClass]:
    """Every policy class in `package`'s modules (a class defining `name` itself), by name, in
    the modules' order; one that does not describe itself as `PolicyClass` says is refused."""
    found: dict[str, PolicyClass] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda info: info.name):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for value in vars(module).values():
            # A class of its own module defining `name`; not a base, nor a model one uses.
            if isinstance(value, type) and value.__module__ == module.__name__:
                if "name" not in vars(value):
                    continue
                policy = _described(value)
                if policy.name in found:
                    raise TypeError(f"two policies are called {policy.name!r}")
                found[policy.name] = policy
    return found


def _described(value: type) -> PolicyClass:
    for field, kind in _DESCRIBED.items():
        if not isinstance(getattr(value, field, None), kind):
            raise TypeError(f"policy {value.__qualname__}: {field} must be a {kind.__name__}")
    default_for = getattr(value, "default_for", None)
    if default_for not in (WITH_OBJECTIVES, WITHOUT_OBJECTIVES, None):
        raise TypeError(f"policy {value.__qualname__}: default_for is {default_for!r}")
    return cast(PolicyClass, value)


def _defaults(policies: dict[str, PolicyClass]) -> dict[str, str]:
    """The policy each kind of spec gets when none is named: exactly one each."""
    defaults: dict[str, str] = {}
    for name, policy in policies.items():
        if policy.default_for is None:
            continue
        if policy.default_for in defaults:
            other = defaults[policy.default_for]
            raise TypeError(f"{other} and {name} are both the default {policy.default_for}")
        defaults[policy.default_for] = name
    for kind in (WITH_OBJECTIVES, WITHOUT_OBJECTIVES):
        if kind not in defaults:
            raise TypeError(f"no policy is the default {kind} (default_for)")
    return defaults


POLICIES: dict[str, PolicyClass] = discover(sys.modules[__name__])
POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)
_DEFAULTS = _defaults(POLICIES)


def default_policy(objectives: bool) -> str:
    """The policy run when none is named, for a spec that sets a TTFT or TPOT objective on
    some tier (`objectives`) or for one that sets none."""
    return _DEFAULTS[WITH_OBJECTIVES if objectives else WITHOUT_OBJECTIVES]


DEFAULT_POLICY = default_policy(objectives=False)  # also `EngineConfig.scheduling`'s


def create_policy(
    name: str = DEFAULT_POLICY,
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
    "DEFAULT_POLICY",
    "POLICIES",
    "POLICY_NAMES",
    "SHED_QUEUE_FULL",
    "SHED_REASONS",
    "SHED_TTFT_OUT_OF_REACH",
    "WITHOUT_OBJECTIVES",
    "WITH_OBJECTIVES",
    "OrderingPolicy",
    "PolicyClass",
    "PolicySettings",
    "PrefillTimeModel",
    "SchedulingPolicy",
    "StepShape",
    "TierObjective",
    "create_policy",
    "default_policy",
    "discover",
]
