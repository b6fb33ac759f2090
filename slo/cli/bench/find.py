"""`slo bench --find-max-rate | --find-max-concurrency`: the arguments turned into a search,
its progress (one line per step) and the answer (see `slo.cli.bench.capacity`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from slo.cli.bench.options import FALLBACK_CONTEXT, BenchOptions, target
from slo.cli.bench.profiles import get_profile, parse_tier_mix
from slo.errors import UsageError
from slo.spec import SLOSpec

if TYPE_CHECKING:  # httpx loads when a search starts, not when the CLI parser is built
    from slo.cli.bench.capacity import CapacityOptions


def run_search(args: argparse.Namespace, options: BenchOptions, spec: SLOSpec) -> int:
    from slo.capacity import result as capacity_file
    from slo.cli.bench.capacity import search, step_shape_sizes, summary_lines
    from slo.cli.bench.runner import fetch_model_info
    from slo.cli.bench.step import StepShape

    mode = "rate" if args.find_max_rate else "concurrency"
    capacity, out_dir = _capacity_options(args, options, mode)
    profile = get_profile(options.profile)
    mix = _tier_mix(options, profile.tier_mix, spec)
    warmup, measured = step_shape_sizes(spec, mix, capacity)
    with target(args.url, args.embedded, args.model, args.spec, tuple(args.serve_arg)) as base_url:
        base_url = base_url.rstrip("/")
        info = fetch_model_info(base_url, options.model)
        shape = StepShape(
            profile=profile,
            mix=mix,
            warmup=warmup,
            measured=measured,
            context=options.max_model_len or info.max_model_len or FALLBACK_CONTEXT,
            seed=options.seed,
            chars_per_token=options.chars_per_token,
            arrival=options.arrival,
            burstiness=options.burstiness,
            request_timeout_s=options.request_timeout_s,
            min_window_s=args.min_window,
            warmup_share=args.warmup,
        )
        print(
            f"slo bench: finding the max {mode} of {base_url} ({info.name}), {profile.name} "
            f"profile, tiers {', '.join(f'{n}={w:.2g}' for n, w in mix)}; each step "
            f"{warmup} warm-up + {measured} measured requests, resolution {capacity.resolution:g}",
            flush=True,
        )
        settings = options.request_settings(info.name, profile.endpoint)
        document = search(spec, shape, capacity, base_url, settings)
    document["engine"]["serve_args"] = list(args.serve_arg)
    capacity_file.write(out_dir / "capacity.json", document)
    for line in summary_lines(document):
        print(line)
    print(
        f"written: {out_dir / 'capacity.json'} and one step-NN.jsonl per step; plan with "
        f"`slo plan {out_dir / 'capacity.json'} --rate TIER=R`"
    )
    return 0 if document[capacity_file.load_key(mode)] is not None else 1


def _capacity_options(
    args: argparse.Namespace, options: BenchOptions, mode: str
) -> tuple[CapacityOptions, Path]:
    """The search's options from its flags, each checked, and the directory it writes to."""
    from slo.cli.bench.capacity import CapacityOptions

    if mode == "concurrency" and options.arrival != "poisson":
        raise UsageError("--arrival shapes open-loop load; --find-max-concurrency is closed-loop")
    out_dir = Path(args.out or "capacity")
    if out_dir.suffix == ".jsonl":
        raise UsageError(
            f"--out {out_dir}: with --find-max-* give a directory, e.g. --out capacity"
        )
    capacity = CapacityOptions(
        mode=mode,
        resolution=args.resolution,
        max_steps=args.max_steps,
        confirm=args.confirm,
        tail_events=args.tail_events,
        warmup_share=args.warmup,
        start=args.start,
        probe_concurrency=args.probe_concurrency,
        out_dir=out_dir,
        cooldown_s=args.cooldown,
    )
    capacity.check()
    if not args.min_window >= 0:
        raise UsageError(f"--min-window must be >= 0, got {args.min_window}")
    if args.serve_arg and not args.embedded:
        raise UsageError("--serve-arg needs --embedded (it passes flags to `slo serve`)")
    return capacity, out_dir


def _tier_mix(
    options: BenchOptions, profile_mix: tuple[tuple[str, float], ...], spec: SLOSpec
) -> tuple[tuple[str, float], ...]:
    """--tier-mix, else the profile's; every tier in it must be one the spec judges."""
    mix = parse_tier_mix(options.tier_mix) if options.tier_mix else profile_mix
    unknown = [name for name, _ in mix if name not in {tier.name for tier in spec.tiers}]
    if unknown:
        raise UsageError(
            f"--tier-mix: tier {unknown[0]!r} is not in the spec; use one of "
            + ", ".join(tier.name for tier in spec.tiers)
        )
    return mix
