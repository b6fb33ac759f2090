"""A replayed trace or multi-turn sessions (`slo.capacity.workloads`) as `slo bench`'s plan."""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence

from slo.capacity.workloads import TraceRequest, read_trace, sessions
from slo.cli.bench.profiles import PlannedRequest, Profile
from slo.cli.common.flags import add_number_flag, add_seconds_flag
from slo.errors import UsageError


def add_workload_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("workloads (instead of the profile's lengths and arrivals)")
    group.add_argument(
        "--trace",
        metavar="FILE",
        help=(
            "replay a JSONL trace: timestamp (ms), input_length, output_length, optional tier and "
            "hash_ids (the Mooncake format)"
        ),
    )
    add_number_flag(
        group,
        "--trace-scale",
        float,
        1.0,
        "replay X times faster: X times the trace's rate",
        metavar="X",
    )
    group.add_argument(
        "--sessions",
        type=int,
        metavar="N",
        help=(
            "multi-turn: N conversations whose turns share a growing prefix, starting at Poisson "
            "times at --rate sessions/s"
        ),
    )
    add_number_flag(group, "--turns", int, 4, "turns per session")
    add_seconds_flag(group, "--think-time", 1.0, "seconds between a session's turns")


def workload_plan(
    args: argparse.Namespace,
    profile: Profile,
    mix: Sequence[tuple[str, float]],
    context: int,
    rate: float | None,
) -> list[PlannedRequest] | None:
    """The plan of --trace or --sessions; None when neither was asked for."""
    if args.trace and args.sessions:
        raise UsageError("--trace and --sessions are two workloads; give one")
    rng = random.Random(args.seed)
    if args.trace:
        entries = read_trace(
            args.trace,
            scale=args.trace_scale,
            chars_per_token=args.chars_per_token,
            max_model_len=context,
        )
    elif args.sessions:
        if rate is None:
            raise UsageError("--sessions is open loop: give --rate (sessions/s), not --concurrency")
        scale = profile.scale_for(context)
        entries = sessions(
            rng,
            args.sessions,
            args.turns,
            rate=rate,
            think_s=args.think_time,
            turn_tokens=max(1, round(profile.input.median * scale / args.turns)),
            output_tokens=max(1, round(profile.output.median * scale)),
            chars_per_token=args.chars_per_token,
        )
    else:
        return None
    return _planned(entries, mix, rng)


def _planned(
    entries: Sequence[TraceRequest], mix: Sequence[tuple[str, float]], rng: random.Random
) -> list[PlannedRequest]:
    names, weights = [name for name, _ in mix], [weight for _, weight in mix]
    return [
        PlannedRequest(
            index,
            entry.tier or rng.choices(names, weights)[0],
            entry.prompt,
            entry.input_tokens,
            entry.output_tokens,
            entry.offset_s,
        )
        for index, entry in enumerate(entries)
    ]
