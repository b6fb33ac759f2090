"""`slo compare --variants fifo,priority,slo`: the mixed-tier overload once per policy.

Premium requests alone first, then beside a batch flood under each scheduling policy (the
workload of `engine.workloads.overload`, the benchmark's), judged by `slo.isolation` against
the spec's tiers: premium p95 TTFT and p99 ITL relative to premium alone, batch tokens/s
relative to fifo, goodput. `--repeats` rounds, interleaved; each variant's rounds pooled
(percentiles over all their requests).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from slo.cli.common.flags import check_at_least_one
from slo.cli.engine_flags import SCHEDULING
from slo.errors import SpecError, UsageError

if TYPE_CHECKING:
    from engine.workloads.overload import OverloadRun
    from slo.spec import SLOSpec, Tier

POLICIES = SCHEDULING  # the engine's policies, as `slo serve --scheduling` names them


def is_scheduling(variants_text: str) -> bool:
    """Whether --variants names scheduling policies (and nothing else)."""
    names = [part.strip() for part in variants_text.split(",") if part.strip()]
    if not names or not any(name in POLICIES for name in names):
        return False
    mixed = [name for name in names if name not in POLICIES]
    if mixed:
        raise UsageError(
            f"--variants: {', '.join(mixed)} cannot be compared in the same run as scheduling "
            f"policies; give either {','.join(POLICIES)} or the serving techniques"
        )
    return True


def _spec(path: str | None) -> SLOSpec:
    from slo.spec import SLOSpec

    try:
        return SLOSpec.load(path) if path else SLOSpec.default()
    except (SpecError, OSError) as error:
        raise UsageError(f"--spec: {error}") from None


def run(args: argparse.Namespace) -> int:
    from slo.isolation import format_table, goals_missed, summarize_rounds

    names = [part.strip() for part in args.variants.split(",") if part.strip()]
    # fifo first: the base of every ratio.
    policies = ["fifo", *(p for p in POLICIES if p in names and p != "fifo")]
    spec = _spec(args.spec)
    tiers = _overload_tiers(spec)
    check_at_least_one({"--repeats": args.repeats})
    if args.duration <= 0:
        raise UsageError(f"--duration must be a positive number of seconds, got {args.duration}")
    rows = summarize_rounds(_run_rounds(args, spec, tiers, policies), spec)
    print()
    print(format_table(rows))
    fifo = rows[0]
    for row in rows[1:]:
        missed = goals_missed(row, fifo)
        print(
            f"{row.policy}: " + ("every goal met" if not missed else "missed " + "; ".join(missed))
        )
    return 0


def _overload_tiers(spec: SLOSpec) -> dict[str, Tier]:
    """The spec's tiers by name; the overload sends premium and batch requests."""
    tiers = {tier.name: tier for tier in spec.tiers}
    for needed in ("premium", "batch"):
        if needed not in tiers:
            raise UsageError(
                f"--spec: the overload needs a '{needed}' tier (tiers: {', '.join(tiers)}); "
                "name your interactive tier premium and your offline tier batch"
            )
    return tiers


def _run_rounds(
    args: argparse.Namespace, spec: SLOSpec, tiers: dict[str, Tier], policies: list[str]
) -> list[tuple[OverloadRun, list[OverloadRun]]]:
    """`--repeats` rounds of premium alone, then the flood under each policy."""
    from slo.isolation import tier_objectives

    try:
        from engine.workloads.overload import OverloadWorkload, run_overload
    except ImportError as error:
        raise UsageError(
            f"slo compare runs the bundled engine: pip install 'llm-slo[engine]' ({error})"
        ) from None
    workload = OverloadWorkload(
        duration_s=args.duration,
        premium_priority=tiers["premium"].priority,
        batch_priority=tiers["batch"].priority,
    )
    model = args.model if args.model != "bundled:small" else "bundled:tiny"
    print(
        f"slo compare: mixed-tier overload on {model}, {args.duration:g}s per run, policies "
        f"{','.join(policies)}, {args.repeats} round(s); premium alone first in each",
        flush=True,
    )
    objectives = tier_objectives(spec)

    def overload(label: str, policy: str, flood: bool = True) -> OverloadRun:
        result = run_overload(
            model,
            policy,
            workload,
            flood=flood,
            tier_objectives=objectives,
            max_num_batched_tokens=args.max_num_batched_tokens,
            device=args.device,
            cpu_threads=args.threads,
        )
        print(f"  {label} {policy if flood else 'alone':<9} {result.wall_s:5.1f}s", flush=True)
        return result

    rounds: list[tuple[OverloadRun, list[OverloadRun]]] = []
    for index in range(args.repeats):
        label = f"round {index + 1}/{args.repeats}"
        alone = overload(label, "fifo", flood=False)
        rounds.append((alone, [overload(label, p) for p in policies]))
    return rounds
