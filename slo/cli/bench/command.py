"""`slo bench`: arguments, the run, and what it prints."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from slo.cli.bench.options import FALLBACK_CONTEXT, BenchOptions, target
from slo.cli.bench.profiles import (
    PROFILES,
    PlannedRequest,
    Profile,
    get_profile,
    parse_tier_mix,
    plan_requests,
)
from slo.cli.bench.search_flags import add_search_flags
from slo.cli.bench.workload_plan import add_workload_flags, workload_plan
from slo.cli.common.flags import (
    add_number_flag,
    add_quiet_flag,
    add_seconds_flag,
    add_seed_flag,
    add_spec_flag,
    check_at_least_one,
)
from slo.errors import UsageError

if TYPE_CHECKING:  # httpx and rich load when a run starts, not when the CLI parser is built
    from slo.cli.bench.runner import RunResult

HELP = "load-test an OpenAI-compatible endpoint; client and server timings per request"
DESCRIPTION = (
    "Send a seeded, profiled stream of requests (Poisson arrivals or a fixed "
    "concurrency, tiers mixed by header) to any OpenAI-compatible server and write one JSONL "
    "record per request: the client's TTFT, ITL, TPOT and e2e next to the server's own "
    "timings. `slo check --results` and `slo report` read the file."
)


def configure(parser: argparse.ArgumentParser) -> None:
    _add_target_flags(parser)
    _add_load_flags(parser)
    add_search_flags(parser)
    _add_tier_flags(parser)
    _add_run_flags(parser)
    _add_model_flags(parser)
    _add_request_flags(parser)
    add_workload_flags(parser)


def _add_target_flags(parser: argparse.ArgumentParser) -> None:
    """Which server the requests go to: one given by URL, or one started for the run."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--url", help="base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000"
    )
    where.add_argument(
        "--embedded",
        action="store_true",
        help="start `slo serve` (bundled engine + middleware) on 127.0.0.1 for the run",
    )


def _add_load_flags(parser: argparse.ArgumentParser) -> None:
    """How much is sent and at what pace: a rate, a concurrency, or a search for the most."""
    parser.add_argument(
        "--profile",
        choices=list(PROFILES),
        default="chat",
        help="traffic shape: " + "; ".join(f"{p.name}: {p.description}" for p in PROFILES.values()),
    )
    add_number_flag(parser, "--requests", int, 100, "requests to send", metavar="N")
    pace = parser.add_mutually_exclusive_group()
    pace.add_argument(
        "--rate",
        type=float,
        metavar="R",
        help="Poisson arrivals at R requests/s (default: the profile's)",
    )
    pace.add_argument(
        "--concurrency",
        type=int,
        metavar="C",
        help="closed loop: C requests in flight at all times",
    )
    pace.add_argument(
        "--find-max-rate",
        action="store_true",
        help=(
            "search the highest arrival rate at which every tier meets its objectives; --out DIR "
            "gets capacity.json (see docs/capacity.md)"
        ),
    )
    pace.add_argument(
        "--find-max-concurrency",
        action="store_true",
        help=(
            "the closed-loop twin of --find-max-rate: the most requests in flight every tier holds"
        ),
    )


def _add_tier_flags(parser: argparse.ArgumentParser) -> None:
    """How requests are drawn into tiers, and the seed behind every draw."""
    parser.add_argument(
        "--tier-mix",
        metavar="T=W,...",
        help="tiers and weights, e.g. premium=0.2,standard=0.7,batch=0.1 (default: the profile's)",
    )
    parser.add_argument(
        "--tier-header",
        default="x-llm-tier",
        help="request header carrying the tier (default: %(default)s)",
    )
    add_seed_flag(parser, "seed of lengths, prompts, tiers and arrivals")


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    """How long the run may take, where its records go and what judges them."""
    add_seconds_flag(
        parser, "--duration-limit", 600.0, "stop after S seconds, keeping what finished"
    )
    parser.add_argument(
        "--out",
        help=(
            "JSONL records, one per finished request (default: run.jsonl); with --find-max-*: a "
            "directory (default: capacity/)"
        ),
    )
    add_spec_flag(
        parser, help="SLO spec for goodput and the verdict (default: the packaged example)"
    )
    add_number_flag(
        parser,
        "--runs",
        int,
        1,
        "repeat the run N times (run i draws from --seed + i - 1); each percentile then gets a "
        "95%% confidence interval over the runs",
        metavar="N",
    )


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    """Which model is asked and how the profile's lengths are fitted to it."""
    parser.add_argument(
        "--model",
        help=(
            "model to ask for (default: the first in /v1/models; with --embedded, the one to "
            "serve: bundled:tiny)"
        ),
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        help=(
            f"context length to fit the profile into (default: /v1/models' max_model_len, else "
            f"{FALLBACK_CONTEXT})"
        ),
    )
    add_number_flag(
        parser,
        "--chars-per-token",
        float,
        1.0,
        "prompt characters per planned token: 1 is exact for byte-level tokenizers and safe for "
        "all; ~4 for BPE",
    )


def _add_request_flags(parser: argparse.ArgumentParser) -> None:
    """How each request is sent and waited for."""
    parser.add_argument(
        "--no-stream",
        action="store_true",
        help="non-streamed requests (no TTFT/ITL at the client; server timings from Server-Timing)",
    )
    parser.add_argument(
        "--no-ignore-eos",
        action="store_true",
        help=(
            "do not send ignore_eos (for servers that reject unknown fields); replies may end early"
        ),
    )
    add_seconds_flag(parser, "--request-timeout", 300.0, "per-request timeout")
    add_quiet_flag(parser)


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    return BenchOptions(
        profile=args.profile,
        requests=args.requests,
        rate=args.rate,
        concurrency=args.concurrency,
        tier_mix=args.tier_mix,
        tier_header=args.tier_header,
        seed=args.seed,
        duration_limit_s=args.duration_limit,
        model=args.model,
        max_model_len=args.max_model_len,
        chars_per_token=args.chars_per_token,
        stream=not args.no_stream,
        ignore_eos=not args.no_ignore_eos,
        request_timeout_s=args.request_timeout,
        progress=not args.quiet,
        arrival=args.arrival,
        burstiness=args.burstiness,
    )


def execute(
    options: BenchOptions,
    base_url: str,
    out: Path,
    args: argparse.Namespace | None = None,
    run_number: int | None = None,
) -> RunResult:
    """Plan and run one benchmark against `base_url`, writing records to `out` as they finish;
    `run_number` numbers one run of several (`--runs`), whose records the file gathers: the
    first run writes it anew, the others append."""
    from slo.cli.bench.runner import fetch_model_info, open_output, run_plan

    options.check()
    profile = get_profile(options.profile)
    mix = parse_tier_mix(options.tier_mix) if options.tier_mix else None
    info = fetch_model_info(base_url.rstrip("/"), options.model)
    context = options.max_model_len or info.max_model_len or FALLBACK_CONTEXT
    rate, concurrency = _pace(options, profile)
    plan = _plan(options, profile, mix, context, rate, concurrency, args)
    pace = (
        f"{options.arrival} {rate:g} req/s" if concurrency is None else f"concurrency {concurrency}"
    )
    tiers = ", ".join(f"{name}={weight:.2g}" for name, weight in (mix or profile.tier_mix))
    # Two lines, so that each fits a terminal of 100 columns.
    print(f"slo bench: {profile.name} profile, {len(plan)} requests, {pace}, tiers {tiers}")
    print(
        f"slo bench: {base_url}, model {info.name} (context {context}"
        f"{'' if options.max_model_len or info.max_model_len else ', assumed'}), "
        f"seed {options.seed}",
        flush=True,
    )
    with open_output(out, append=(run_number or 1) > 1) as handle:
        return asyncio.run(
            run_plan(
                base_url.rstrip("/"),
                plan,
                options.request_settings(info.name, profile.endpoint),
                concurrency=concurrency,
                duration_limit_s=options.duration_limit_s,
                out=handle,
                progress=options.progress,
                run_number=run_number,
            )
        )


def _pace(options: BenchOptions, profile: Profile) -> tuple[float | None, int | None]:
    """(rate, concurrency) as given, else the profile's own pace."""
    if options.rate is None and options.concurrency is None:
        if profile.arrival == "poisson":
            return profile.rate, None
        return None, profile.concurrency
    return options.rate, options.concurrency


def _plan(
    options: BenchOptions,
    profile: Profile,
    mix: tuple[tuple[str, float], ...] | None,
    context: int,
    rate: float | None,
    concurrency: int | None,
    args: argparse.Namespace | None,
) -> list[PlannedRequest]:
    """The profile's seeded requests, or the workload's (--trace, --sessions) when one is given."""
    plan = plan_requests(
        profile,
        options.requests,
        seed=options.seed,
        max_model_len=context,
        rate=rate if concurrency is None else None,
        tier_mix=mix,
        chars_per_token=options.chars_per_token,
        arrival=options.arrival,
        burstiness=options.burstiness,
    )
    if args is not None:
        replayed = workload_plan(args, profile, mix or profile.tier_mix, context, rate)
        if replayed is not None:
            plan = replayed[: options.requests]
            print(f"slo bench: {len(plan)} of the workload's {len(replayed)} requests (--requests)")
    return plan


def run(args: argparse.Namespace) -> int:
    from slo.spec import SLOSpec

    options = options_from_args(args)
    options.check()
    check_at_least_one({"--runs": args.runs})
    spec = SLOSpec.load(args.spec) if args.spec else SLOSpec.default()
    if args.find_max_rate or args.find_max_concurrency:
        if args.runs != 1:
            raise UsageError("--runs repeats a plain run; a --find-max-* search confirms its own")
        from slo.cli.bench.find import run_search

        return run_search(args, options, spec)
    if args.serve_arg:
        raise UsageError("--serve-arg is for --find-max-*; start `slo serve` yourself instead")
    out = Path(args.out or "run.jsonl")
    results = _runs(options, args, out)
    from slo.cli.bench.runs import print_summary

    print_summary(spec, results)
    written = sum(len(result.records) for result in results)
    print(
        f"records: {out} ({written} lines); judge them with "
        f"`slo check --results {out}`, draw them with `slo report --results {out}`"
    )
    return 130 if results[-1].stopped_by == "interrupt" else 0


def _runs(options: BenchOptions, args: argparse.Namespace, out: Path) -> list[RunResult]:
    """`--runs` runs against one server, into one file; an interrupt ends them where it fell."""
    from dataclasses import replace

    results: list[RunResult] = []
    with target(args.url, args.embedded, args.model, args.spec) as base_url:
        for number in range(1, args.runs + 1):
            seeded = replace(options, seed=options.seed + number - 1)
            tag = number if args.runs > 1 else None
            results.append(execute(seeded, base_url, out, args, tag))
            prefix = f"run {number} of {args.runs}: " if tag else ""
            print(prefix + describe_stop(results[-1]), flush=True)
            if results[-1].stopped_by == "interrupt":
                break
    return results


def describe_stop(result: RunResult) -> str:
    done = (
        f"{len(result.records)} of {result.planned} requests finished in {result.elapsed_s:.1f} s"
    )
    if result.stopped_by is None:
        return done
    return (
        f"{done}; stopped by the {result.stopped_by}, {result.cancelled_in_flight} in flight "
        "were cancelled and are not in the records"
    )
