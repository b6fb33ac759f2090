"""`slo plan`: replicas and cost for a target load, from `slo bench --find-max-rate`'s
capacity.json (the arithmetic, written out, is in `slo.capacity.plan`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from slo.cli.common.flags import add_number_flag
from slo.errors import UsageError

HELP = "replicas and cost for a target load, from slo bench --find-max-rate's capacity.json"
DESCRIPTION = (
    "Turn capacity.json files (`slo bench --find-max-rate --out DIR`) and a target rate per "
    "tier, or a day's profile, into replicas with a stated headroom, cost per hour and per "
    "million output tokens. Several files (runs with other --quantization, --scheduling or "
    "batch size) are compared with the first."
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "capacity", nargs="+", help="capacity.json files or the directories holding them"
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--rate", metavar="T=R,...", help="target requests/s per tier, e.g. premium=10,standard=30"
    )
    target.add_argument(
        "--peak-rate",
        type=float,
        metavar="R",
        help="target total requests/s at the measured tier mix",
    )
    target.add_argument(
        "--diurnal",
        metavar="H=R,...",
        help="a day: hour=requests/s, each holding until the next, e.g. 0=10,8=50,20=20",
    )
    add_number_flag(
        parser,
        "--headroom",
        float,
        0.2,
        "share of each replica's capacity kept free at the target",
    )
    parser.add_argument(
        "--price", type=float, metavar="USD", help="price of one replica-hour, for the cost lines"
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def run(args: argparse.Namespace) -> int:
    from slo.capacity import plan as arithmetic
    from slo.capacity import result as capacity_file

    if args.price is not None and not args.price >= 0:
        raise UsageError(f"--price must be >= 0, got {args.price}")
    documents = [(path, capacity_file.read(path)) for path in args.capacity]
    for path, document in documents:
        if document["mode"] != "rate" or not document.get("max_rate"):
            raise UsageError(
                f"{path}: no max_rate to plan from (a --find-max-concurrency run, or no load "
                "passed); run `slo bench --find-max-rate --out DIR`"
            )
    day = arithmetic.parse_diurnal(args.diurnal) if args.diurnal else None
    if args.rate:
        rates = arithmetic.parse_rates(args.rate)
        target = sum(rates.values())
    else:
        rates = None
        target = args.peak_rate if day is None else max(rate for _, rate in day)
        if not target > 0:
            raise UsageError(f"--peak-rate must be > 0, got {target}")
    plans = [_plan(str(path), doc, target, rates, day, args) for path, doc in documents]
    if args.json:
        print(
            json.dumps({"target_rps": target, "headroom": args.headroom, "plans": plans}, indent=2)
        )
    else:
        print("\n".join(_lines(plans, target, args.headroom)))
    return 0


def _plan(
    path: str,
    document: dict[str, Any],
    target: float,
    rates: dict[str, float] | None,
    day: list[tuple[int, float]] | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    from slo.capacity import plan as arithmetic

    max_rate = float(document["max_rate"])
    replicas = arithmetic.replicas_for(target, max_rate, args.headroom)
    tokens = arithmetic.mean_output_tokens(document)
    measured_mix = (document.get("workload") or {}).get("tier_mix") or {}
    plan: dict[str, Any] = {
        "capacity": path,
        "max_rate": max_rate,
        "knobs": arithmetic.knobs(document),
        "replicas": replicas.replicas,
        "achieved_headroom": round(replicas.achieved_headroom, 4),
        "mean_output_tokens": tokens,
        "warnings": arithmetic.mix_warnings(rates, measured_mix) if rates else [],
    }
    if args.price is not None:
        cost = arithmetic.cost_of(replicas, args.price, tokens)
        plan.update(
            cost_per_hour=round(cost.per_hour, 4),
            cost_per_million_output_tokens=_round(cost.per_million_output_tokens),
            floor_cost_per_million_output_tokens=_round(cost.floor_per_million_output_tokens),
        )
    if day is not None:
        planned = arithmetic.plan_day(day, max_rate, args.headroom)
        plan.update(
            replicas_by_hour=planned.replicas_by_hour,
            replica_hours=planned.replica_hours,
            static_replica_hours=planned.static_replica_hours,
        )
        if args.price is not None:
            plan["cost_per_day"] = round(planned.replica_hours * args.price, 4)
            plan["static_cost_per_day"] = round(planned.static_replica_hours * args.price, 4)
    return plan


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _lines(plans: list[dict[str, Any]], target: float, headroom: float) -> list[str]:
    lines = [f"target {target:g} req/s, headroom {headroom:.0%} of each replica kept free"]
    first = plans[0]
    for plan in plans:
        knobs = ", ".join(f"{k} {v}" for k, v in plan["knobs"].items() if v is not None)
        lines.append(
            f"{plan['capacity']}: max_rate {plan['max_rate']:g} req/s"
            + (f" ({knobs})" if knobs else "")
        )
        lines.append(
            f"  replicas {plan['replicas']} (headroom at the target "
            f"{plan['achieved_headroom']:.0%})"
        )
        if "cost_per_hour" in plan:
            per_million = plan["cost_per_million_output_tokens"]
            lines.append(
                f"  cost ${plan['cost_per_hour']:.2f}/h"
                + (
                    f", ${per_million:.4g} per million output tokens (floor at max_rate "
                    f"${plan['floor_cost_per_million_output_tokens']:.4g})"
                    if per_million is not None
                    else ", no output tokens measured"
                )
            )
        if "replica_hours" in plan:
            lines.append(
                f"  a day: {plan['replica_hours']} replica-hours scaled by the hour, "
                f"{plan['static_replica_hours']} held at the peak"
            )
        if plan is not first:
            lines.append("  against the first: " + _against(first, plan))
        lines += [f"  warning: {warning}" for warning in plan["warnings"]]
    return lines


def _against(first: dict[str, Any], plan: dict[str, Any]) -> str:
    changed = [
        f"{k} {first['knobs'].get(k)} -> {v}"
        for k, v in plan["knobs"].items()
        if v != first["knobs"].get(k)
    ]
    text = (
        f"max_rate {plan['max_rate'] / first['max_rate'] - 1:+.0%}, replicas "
        f"{plan['replicas'] - first['replicas']:+d}"
    )
    if plan.get("cost_per_million_output_tokens") and first.get("cost_per_million_output_tokens"):
        ratio = plan["cost_per_million_output_tokens"] / first["cost_per_million_output_tokens"]
        text += f", cost per million output tokens {ratio - 1:+.0%}"
    return text + (f" ({'; '.join(changed)})" if changed else " (same engine knobs)")
