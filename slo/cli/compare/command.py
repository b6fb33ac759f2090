"""`slo compare`: run the engine once per serving technique and print the ratios to the baseline."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING

from slo.cli.common.flags import (
    add_number_flag,
    add_seed_flag,
    add_spec_flag,
    check_at_least_one,
)
from slo.cli.compare.matrix import VARIANTS, Measurement
from slo.errors import UsageError

if TYPE_CHECKING:
    from engine.workloads.compare import VariantRun, WorkItem
    from slo.cli.bench.profiles import Profile

HELP = (
    "measure what INT8, prefix caching, speculative decoding and batching buy, or what each "
    "scheduling policy does under a batch flood (--variants fifo,priority,slo)"
)
DESCRIPTION = (
    "Run the same seeded workload against the embedded engine once per "
    "variant and print TTFT, TPOT, throughput, CPU cost per 1k tokens and greedy agreement "
    "as ratios to the baseline, next to the industry comparison matrix's claimed ranges. "
    "Writes an HTML report with a chart. With --variants fifo,priority,slo: the mixed-tier "
    "overload (premium requests beside a batch flood) once per scheduling policy, premium "
    "latency relative to premium alone, batch tokens/s relative to fifo, and goodput."
)


def configure(parser: argparse.ArgumentParser) -> None:
    _add_workload_flags(parser)
    _add_model_flags(parser)
    _add_run_flags(parser)
    _add_scheduling_flags(parser)
    parser.add_argument(
        "--report",
        default="slo-compare.html",
        help="HTML report with the matrix and chart (default: %(default)s)",
    )


def _add_workload_flags(parser: argparse.ArgumentParser) -> None:
    """What is compared, and the seeded workload each variant is given."""
    parser.add_argument("--profile", default="chat", help="traffic profile (default: %(default)s)")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma-separated, from " + ",".join(VARIANTS) + " (default: all); or "
        "scheduling policies, from fifo,priority,slo",
    )
    parser.add_argument("--requests", type=int, default=16, help="requests per variant")
    add_seed_flag(parser, "workload seed")


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    """The models, the device, and how the profile's prompts are fitted to them."""
    parser.add_argument(
        "--model", default="bundled:small", help="target model (default: %(default)s)"
    )
    parser.add_argument(
        "--draft-model",
        default="bundled:small-draft",
        help="draft for the speculative variant (default: %(default)s)",
    )
    parser.add_argument("--speculative-tokens", type=int, default=4, help="draft tokens per step")
    add_number_flag(
        parser, "--context", int, 512, "shrink the profile's lengths to fit this many tokens"
    )
    add_number_flag(
        parser,
        "--shared-prefix-chars",
        int,
        256,
        "a system prompt this long opens every prompt, as in chat",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    """How each variant is run: its arrivals, how many times, on how many CPU threads."""
    parser.add_argument(
        "--rate",
        type=float,
        default=16.0,
        help="Poisson arrivals per second; 16 keeps a CPU engine busy, where the profile's own "
        "rate would leave it idle and every throughput equal (0 sends all at once; "
        "default: %(default)s)",
    )
    add_number_flag(
        parser,
        "--repeats",
        int,
        3,
        "runs per variant, interleaved, medians kept: steadier on a shared machine",
    )
    add_number_flag(
        parser, "--threads", int, 1, "torch CPU threads; 1 keeps runs steady on a shared machine"
    )


def _add_scheduling_flags(parser: argparse.ArgumentParser) -> None:
    """What only the scheduling variants (--variants fifo,priority,slo) read."""
    add_spec_flag(
        parser,
        help="scheduling variants: the SLO spec whose premium and batch tiers are judged and "
        "scheduled by (default: the packaged example)",
    )
    add_number_flag(
        parser, "--duration", float, 6.0, "scheduling variants: seconds of traffic per run"
    )
    add_number_flag(
        parser,
        "--max-num-batched-tokens",
        int,
        256,
        "scheduling variants: the engine's per-step token budget",
    )


def run(args: argparse.Namespace) -> int:
    from slo.cli.bench.profiles import get_profile
    from slo.cli.compare.matrix import format_matrix, parse_variants, render_html
    from slo.cli.compare.scheduling import is_scheduling

    if is_scheduling(args.variants):
        from slo.cli.compare.scheduling import run as run_scheduling

        return run_scheduling(args)
    variants = parse_variants(args.variants)
    _check_counts(args)
    profile = get_profile(args.profile)
    work = _work(args, profile)
    model: str = args.model
    print(
        f"slo compare: {len(work)} {profile.name} requests per variant, model {model}, "
        f"variants {','.join(variants)}",
        flush=True,
    )
    runs = _run_variants(args, variants, work)
    baseline = runs["baseline"][0]
    measurements = [
        median_measurement([measurement(r, baseline) for r in runs[v]]) for v in variants
    ]
    print()
    print(format_matrix(measurements))
    report = Path(args.report)
    report.write_text(render_html(measurements, f"slo compare: {profile.name}, {model}"))
    print(f"\nreport: {report}")
    return 0


def _check_counts(args: argparse.Namespace) -> None:
    check_at_least_one({"--requests": args.requests, "--repeats": args.repeats})
    rate: float = args.rate
    if rate < 0:
        raise UsageError(f"--rate must be >= 0, got {rate}")


def _work(args: argparse.Namespace, profile: Profile) -> list[WorkItem]:
    """The seeded requests every variant is sent, each opening with the shared prefix."""
    from slo.cli.bench.profiles import plan_requests
    from slo.cli.compare.matrix import shared_prefix

    # 0 sends everything at once (a closed loop): no arrival rate in the plan.
    planned = plan_requests(
        profile, args.requests, seed=args.seed, max_model_len=args.context, rate=args.rate or None
    )
    try:
        from engine.workloads.compare import WorkItem
    except ImportError as error:
        raise UsageError(
            f"slo compare runs the bundled engine: pip install 'llm-slo[engine]' ({error})"
        ) from None
    prefix = shared_prefix(args.shared_prefix_chars)
    return [WorkItem(prefix + p.prompt, p.max_tokens, p.offset_s) for p in planned]


def _run_variants(
    args: argparse.Namespace, variants: list[str], work: list[WorkItem]
) -> dict[str, list[VariantRun]]:
    """Every variant `--repeats` times, interleaved, so a noisy minute hits every variant alike."""
    from engine.workloads.compare import run_variant

    repeats: int = args.repeats
    runs: dict[str, list[VariantRun]] = {variant: [] for variant in variants}
    for repeat in range(repeats):
        for variant in variants:
            variant_run = run_variant(
                args.model,
                variant,
                work,
                draft_model=args.draft_model,
                num_speculative_tokens=args.speculative_tokens,
                device=args.device,
                seed=args.seed,
                threads=args.threads,
            )
            print(
                f"  run {repeat + 1}/{repeats} {variant:<13} {variant_run.wall_s:5.1f}s  "
                f"{variant_run.output_tokens} tokens",
                flush=True,
            )
            runs[variant].append(variant_run)
    return runs


def median_measurement(repeats: list[Measurement]) -> Measurement:
    """Each number the median over the repeats of one variant."""

    def middle(values: list[float | None]) -> float | None:
        present = [value for value in values if value is not None]
        return median(present) if present else None

    return replace(
        repeats[0],
        ttft_p50_s=median(m.ttft_p50_s for m in repeats),
        tpot_p50_s=median(m.tpot_p50_s for m in repeats),
        throughput_tok_s=median(m.throughput_tok_s for m in repeats),
        cpu_s_per_1k_tokens=median(m.cpu_s_per_1k_tokens for m in repeats),
        wall_s=median(m.wall_s for m in repeats),
        agreement=middle([m.agreement for m in repeats]),
        acceptance_rate=middle([m.acceptance_rate for m in repeats]),
        prefix_hit_rate=middle([m.prefix_hit_rate for m in repeats]),
    )


def measurement(run: VariantRun, baseline: VariantRun) -> Measurement:
    """An engine run as the pure record the matrix formats; agreement is the greedy tokens
    each request shares with the baseline's before the first difference."""
    tokens = max(run.output_tokens, 1)
    agree = sum(
        next(
            (i for i, (a, b) in enumerate(zip(mine, base, strict=False)) if a != b),
            min(len(mine), len(base)),
        )
        for mine, base in zip(run.token_ids, baseline.token_ids, strict=True)
    )
    totals = run.totals
    return Measurement(
        variant=run.variant,
        requests=len(run.token_ids),
        output_tokens=run.output_tokens,
        ttft_p50_s=median(run.ttft_s),
        tpot_p50_s=median(run.tpot_s) if run.tpot_s else 0.0,
        throughput_tok_s=run.output_tokens / run.wall_s if run.wall_s > 0 else 0.0,
        cpu_s_per_1k_tokens=run.cpu_s / tokens * 1000,
        wall_s=run.wall_s,
        agreement=agree / max(baseline.output_tokens, 1),
        acceptance_rate=(
            totals.spec_accepted_tokens / totals.spec_draft_tokens
            if totals.spec_draft_tokens
            else None
        ),
        prefix_hit_rate=(
            totals.prefix_cache_hit_tokens / totals.prefix_cache_queried_tokens
            if totals.prefix_cache_queried_tokens
            else None
        ),
    )
