"""Tier isolation, judged: one overload run per scheduling policy against premium alone.

Pure: runs in (any objects with `policy`, `wall_s`, `requests`, each request with `tier`,
`outcome`, `ttft_s`, `tpot_s`, `e2e_s`, `itl_s`, `output_tokens`), table out. The runs
themselves happen in `engine.workloads.overload`, called from the benchmark and `slo compare`.

Per policy: premium p95 TTFT and p99 ITL relative to premium alone, batch tokens/s relative
to fifo, and goodput: requests per second that were served (not shed) and met every
per-request latency objective of their tier (DistServe's measure), over all tiers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from slo.arithmetic import goodput_checks
from slo.check.evaluate import nearest_rank
from slo.spec import SLOSpec

# The acceptance goals of the `slo` policy (tier-isolation issue).
GOAL_LATENCY_RATIO = 3.0  # premium p95 TTFT and p99 ITL within 3x of premium alone
GOAL_BATCH_SHARE = 0.8  # batch tokens/s at least 80% of fifo's


@dataclass(frozen=True, slots=True)
class IsolationRow:
    policy: str
    premium_ttft_p95_s: float
    premium_itl_p99_s: float
    ttft_ratio: float  # to premium alone
    itl_ratio: float
    batch_tokens_per_s: float
    batch_ratio: float  # to fifo (1.0 for fifo itself)
    goodput_rps: float  # good requests per second, every tier
    good_share: float  # good requests / requests sent
    shed: int


def percentile(values: Iterable[float | None], target: float) -> float:
    """Nearest-rank percentile (the evaluator's); NaN for no values."""
    array = np.asarray([v for v in values if v is not None], dtype=float)
    return nearest_rank(array, target) if array.size else float("nan")


def good_requests(run: Any, spec: SLOSpec) -> int:
    """Served requests that meet every per-request latency objective of their tier."""
    checks = {tier.name: goodput_checks(tier.objectives) for tier in spec.tiers}
    good = 0
    for request in run.requests:
        if request.outcome != "ok":
            continue
        tier_checks = checks.get(request.tier, ())
        if all(check.passes(getattr(request, check.field, None)) for check in tier_checks):
            good += 1
    return good


def _tokens_per_s(run: Any, tier: str) -> float:
    tokens = sum(r.output_tokens for r in run.requests if r.tier == tier)
    return tokens / run.wall_s if run.wall_s > 0 else 0.0


def summarize(
    alone: Any,
    runs: Sequence[Any],
    spec: SLOSpec,
    premium: str = "premium",
    batch: str = "batch",
) -> list[IsolationRow]:
    """One row per run; ratios to `alone` (premium without the flood) and to the fifo run."""

    def premium_latency(run: Any) -> tuple[float, float]:
        requests = [r for r in run.requests if r.tier == premium and r.outcome == "ok"]
        gaps = [gap for r in requests for gap in r.itl_s]
        return percentile((r.ttft_s for r in requests), 0.95), percentile(gaps, 0.99)

    alone_ttft, alone_itl = premium_latency(alone)
    fifo = next((run for run in runs if run.policy == "fifo"), runs[0])
    fifo_batch = _tokens_per_s(fifo, batch)
    rows = []
    for run in runs:
        ttft, itl = premium_latency(run)
        batch_tps = _tokens_per_s(run, batch)
        good = good_requests(run, spec)
        rows.append(
            IsolationRow(
                policy=run.policy,
                premium_ttft_p95_s=ttft,
                premium_itl_p99_s=itl,
                ttft_ratio=ttft / alone_ttft if alone_ttft > 0 else float("nan"),
                itl_ratio=itl / alone_itl if alone_itl > 0 else float("nan"),
                batch_tokens_per_s=batch_tps,
                batch_ratio=batch_tps / fifo_batch if fifo_batch > 0 else float("nan"),
                goodput_rps=good / run.wall_s if run.wall_s > 0 else 0.0,
                good_share=good / len(run.requests) if run.requests else 0.0,
                shed=sum(1 for r in run.requests if r.outcome == "shed"),
            )
        )
    return rows


@dataclass
class PooledRun:
    """Several runs of one variant as one: their requests together, their walls summed."""

    policy: str
    wall_s: float
    requests: list[Any]


def pool_runs(runs: Sequence[Any]) -> PooledRun:
    return PooledRun(
        runs[0].policy,
        sum(run.wall_s for run in runs),
        [request for run in runs for request in run.requests],
    )


def summarize_rounds(
    rounds: Sequence[tuple[Any, Sequence[Any]]], spec: SLOSpec
) -> list[IsolationRow]:
    """Rounds of (premium alone, one run per policy), each variant's runs pooled: percentiles
    over all their requests, rates over all their time. A p95 of one 6-second run rests on
    its 2 worst of 30 premium requests, and a few of those are slow whatever the policy
    (waking an idle CPU), so per-round figures swing by 2x; pooled, they hold still. Rounds
    interleave the variants, so load that comes and goes meets each of them alike."""
    alone = pool_runs([alone for alone, _ in rounds])
    policies = [run.policy for run in rounds[0][1]]
    pooled = [
        pool_runs([run for _, runs in rounds for run in runs if run.policy == policy])
        for policy in policies
    ]
    return summarize(alone, pooled, spec)


def goals_missed(row: IsolationRow, fifo: IsolationRow) -> list[str]:
    """The acceptance goals a policy's row misses (empty: all met)."""
    missed = []
    if not row.ttft_ratio <= GOAL_LATENCY_RATIO:
        missed.append(f"premium p95 TTFT {row.ttft_ratio:.1f}x alone (goal <= 3x)")
    if not row.itl_ratio <= GOAL_LATENCY_RATIO:
        missed.append(f"premium p99 ITL {row.itl_ratio:.1f}x alone (goal <= 3x)")
    if not row.batch_ratio >= GOAL_BATCH_SHARE:
        missed.append(f"batch tokens/s {row.batch_ratio:.0%} of fifo's (goal >= 80%)")
    if not row.goodput_rps > fifo.goodput_rps:
        missed.append(
            f"goodput {row.goodput_rps:.2f} req/s, fifo's {fifo.goodput_rps:.2f} (goal: higher)"
        )
    return missed


def format_table(rows: Sequence[IsolationRow]) -> str:
    """The comparison table: premium figures with their ratio to premium alone, batch tokens/s
    with its ratio to fifo, goodput, the share of requests that were good, and sheds."""
    lines = [
        "ratios: premium to premium alone, batch to fifo",
        f"{'policy':<9} {'prem p95 TTFT':>16} {'prem p99 ITL':>16} {'batch tok/s':>16} "
        f"{'goodput':>12} {'good':>6} {'shed':>5}",
    ]
    for row in rows:
        lines.append(
            f"{row.policy:<9} "
            f"{row.premium_ttft_p95_s * 1000:7.1f}ms {row.ttft_ratio:5.1f}x "
            f"{row.premium_itl_p99_s * 1000:7.1f}ms {row.itl_ratio:5.1f}x "
            f"{row.batch_tokens_per_s:8.0f} {row.batch_ratio:6.0%} "
            f"{row.goodput_rps:6.2f} req/s {row.good_share:6.0%} {row.shed:5d}"
        )
    return "\n".join(lines)


def tier_objectives(spec: SLOSpec) -> dict[int, tuple[float | None, float | None]]:
    """Each tier's priority -> (TTFT, TPOT) thresholds in seconds, what the engine's `slo`
    policy schedules by (`EngineConfig.tier_objectives`); the tightest if a tier has several."""
    out: dict[int, tuple[float | None, float | None]] = {}
    for tier in spec.tiers:
        limits: dict[str, float] = {}
        for objective in tier.latency_objectives:
            if objective.sli in ("ttft", "tpot") and objective.threshold_s is not None:
                current = limits.get(objective.sli)
                limits[objective.sli] = min(current or objective.threshold_s, objective.threshold_s)
        if limits:
            out[tier.priority] = (limits.get("ttft"), limits.get("tpot"))
    return out


# The family benchmark's goals (issue 25), per draw, for the policy default flags choose.
GOAL_TTFT_MARGIN = 0.8  # premium p95 TTFT at most 0.8x its objective


@dataclass(frozen=True, slots=True)
class DrawRow:
    """One policy's run of one draw, judged against the spec's premium objectives."""

    policy: str
    premium_ttft_p95_s: float
    premium_tpot_p95_s: float
    batch_tokens_per_s: float
    goodput_rps: float
    shed: int


def draw_row(run: Any, spec: SLOSpec, premium: str = "premium", batch: str = "batch") -> DrawRow:
    served = [r for r in run.requests if r.tier == premium and r.outcome == "ok"]
    return DrawRow(
        policy=run.policy,
        premium_ttft_p95_s=percentile((r.ttft_s for r in served), 0.95),
        premium_tpot_p95_s=percentile((r.tpot_s for r in served), 0.95),
        batch_tokens_per_s=_tokens_per_s(run, batch),
        goodput_rps=good_requests(run, spec) / run.wall_s if run.wall_s > 0 else 0.0,
        shed=sum(1 for r in run.requests if r.outcome == "shed"),
    )


def draw_goals_missed(
    judged: DrawRow, peers: dict[str, DrawRow], spec: SLOSpec, premium: str = "premium"
) -> list[str]:
    """The family goals `judged` misses against its peers (`fifo`, `priority`) on one draw:
    premium p95 TTFT <= 0.8x its objective and p95 TPOT within its objective, batch tokens/s
    >= 80% of fifo's, goodput above fifo's and priority's."""
    ttft_s, tpot_s = tier_objectives(spec).get(spec.tier(premium).priority, (None, None))
    missed = []
    if ttft_s is not None and not judged.premium_ttft_p95_s <= GOAL_TTFT_MARGIN * ttft_s:
        missed.append(
            f"premium p95 TTFT {judged.premium_ttft_p95_s * 1000:.0f} ms > "
            f"{GOAL_TTFT_MARGIN} x {ttft_s * 1000:.0f} ms"
        )
    if tpot_s is not None and not judged.premium_tpot_p95_s <= tpot_s:
        missed.append(
            f"premium p95 TPOT {judged.premium_tpot_p95_s * 1000:.1f} ms > {tpot_s * 1000:.0f} ms"
        )
    fifo = peers["fifo"]
    if not judged.batch_tokens_per_s >= GOAL_BATCH_SHARE * fifo.batch_tokens_per_s:
        share = judged.batch_tokens_per_s / max(fifo.batch_tokens_per_s, 1e-9)
        missed.append(f"batch tokens/s {share:.0%} of fifo's (goal >= 80%)")
    for name, peer in peers.items():
        if not judged.goodput_rps > peer.goodput_rps:
            missed.append(
                f"goodput {judged.goodput_rps:.2f} req/s, {name}'s {peer.goodput_rps:.2f}"
            )
    return missed


def format_draw(rows: Sequence[DrawRow]) -> str:
    lines = [
        f"{'policy':<9} {'prem p95 TTFT':>14} {'prem p95 TPOT':>14} {'batch tok/s':>12} "
        f"{'goodput':>12} {'shed':>5}"
    ]
    for row in rows:
        lines.append(
            f"{row.policy:<9} {row.premium_ttft_p95_s * 1000:11.1f} ms "
            f"{row.premium_tpot_p95_s * 1000:11.2f} ms {row.batch_tokens_per_s:12.0f} "
            f"{row.goodput_rps:6.2f} req/s {row.shed:5d}"
        )
    return "\n".join(lines)
