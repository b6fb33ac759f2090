"""Where observed latency stands against the industry: performance tiers and benchmarks.

This module is where the repository keeps these figures, as numbers: the five performance
tiers by TTFT, TPOT and throughput, and the typical production p50/p95/p99 bands, taken from
the "Performance tiers" and "Industry benchmarks" tables of the article on LLM serving latency
this project grew from (not shipped with it). Throughput there is per GPU; we measure per
deployment, so divide by the GPU count before comparing across setups.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class PerformanceTier:
    name: str
    ttft_max_s: float
    tpot_max_s: float
    min_tokens_per_s: float
    description: str


# Fastest first: an observation belongs to the first tier whose bounds it meets, its throughput
# floor included. The article gives Ultra Low Latency no floor of its own ("variable, latency
# prioritized"); it is held to Basic's, the lowest any tier has: a run below every floor serves
# at no tier, however fast each request.
LATENCY_TIERS: tuple[PerformanceTier, ...] = (
    PerformanceTier(
        "Ultra Low Latency",
        0.100,
        0.020,
        100.0,
        "TTFT < 100 ms, TPOT < 20 ms, >= 100 tokens/s/GPU (Basic's floor)",
    ),
    PerformanceTier(
        "High Performance",
        0.200,
        0.030,
        1000.0,
        "TTFT 100-200 ms, TPOT 20-30 ms, >= 1000 tokens/s/GPU",
    ),
    PerformanceTier(
        "Optimized", 0.500, 0.050, 500.0, "TTFT 200-500 ms, TPOT 30-50 ms, >= 500 tokens/s/GPU"
    ),
    PerformanceTier(
        "Basic", 2.0, 0.100, 100.0, "TTFT 500 ms-2 s, TPOT 50-100 ms, >= 100 tokens/s/GPU"
    ),
)
COST_OPTIMIZED = PerformanceTier(
    "Cost Optimized", 5.0, 0.100, 2000.0, "TTFT up to 5 s, TPOT 50-100 ms, > 2000 tokens/s/GPU"
)
BELOW_BASIC = "below Basic"

# metric -> (p50 band, p95 band, p99 band) in seconds; "typical production" from the article.
INDUSTRY_BANDS: dict[str, tuple[tuple[float, float], ...]] = {
    "ttft": ((0.150, 0.300), (0.300, 0.600), (0.500, 1.0)),
    "tpot": ((0.020, 0.040), (0.040, 0.080), (0.060, 0.120)),
    "e2e": ((2.0, 4.0), (4.0, 8.0), (6.0, 12.0)),
    "queue": ((0.0, 0.050), (0.100, 0.500), (0.500, 2.0)),
}
WORLD_CLASS_P95: dict[str, float] = {"ttft": 0.100, "tpot": 0.020, "e2e": 2.0, "queue": 0.020}


@dataclass(frozen=True, slots=True)
class Classification:
    """The performance tier of a set of requests and the figures it rests on."""

    tier: str
    ttft_p95_s: float | None
    tpot_p95_s: float | None
    tokens_per_s: float | None
    reason: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _known(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


@dataclass(frozen=True, slots=True)
class Miss:
    """The bound of a tier that the figures miss: which one, and in words."""

    bound: str  # "ttft", "tpot" or "throughput"
    words: str


def missed_bound(
    tier: PerformanceTier,
    ttft_p95_s: float | None,
    tpot_p95_s: float | None,
    tokens_per_s: float | None,
) -> Miss | None:
    """The first of the tier's bounds (TTFT, TPOT, throughput floor) the figures miss, None
    when they meet all three. An unknown figure is not held against a tier (a non-streaming
    run has no TPOT)."""
    if _known(ttft_p95_s) and ttft_p95_s > tier.ttft_max_s:  # type: ignore[operator]
        return Miss("ttft", f"p95 TTFT above its {tier.ttft_max_s * 1e3:g} ms")
    if _known(tpot_p95_s) and tpot_p95_s > tier.tpot_max_s:  # type: ignore[operator]
        return Miss("tpot", f"p95 TPOT above its {tier.tpot_max_s * 1e3:g} ms")
    if _known(tokens_per_s) and tokens_per_s < tier.min_tokens_per_s:  # type: ignore[operator]
        return Miss(
            "throughput",
            f"{tokens_per_s:.0f} tokens/s below its floor of {tier.min_tokens_per_s:g} tokens/s",
        )
    return None


def classify(
    ttft_p95_s: float | None, tpot_p95_s: float | None, tokens_per_s: float | None
) -> Classification:
    """The fastest tier whose p95 TTFT, p95 TPOT and throughput floor all hold; the reason
    says which bound kept it from the tier above.

    A deployment slower than Basic on TTFT but within 5 s and above 2000 tokens/s is Cost
    Optimized: it traded latency for throughput on purpose.
    """
    figures = (ttft_p95_s, tpot_p95_s, tokens_per_s)
    if not _known(ttft_p95_s) and not _known(tpot_p95_s):
        return Classification("unknown", *figures, "no TTFT or TPOT")
    described = _describe(*figures)
    high_throughput = _known(tokens_per_s) and tokens_per_s > COST_OPTIMIZED.min_tokens_per_s  # type: ignore[operator]
    passed: list[tuple[PerformanceTier, Miss]] = []  # the faster tiers, each with its miss
    for tier in LATENCY_TIERS:
        miss = missed_bound(tier, *figures)
        if miss is None:
            if tier.name == "Basic" and high_throughput:
                break  # slow-ish latency bought with throughput: say so
            reason = f"{described}: {tier.description}{_why_not(passed)}"
            return Classification(tier.name, *figures, reason)
        passed.append((tier, miss))
    if high_throughput and missed_bound(COST_OPTIMIZED, *figures) is None:
        reason = f"{described}: {COST_OPTIMIZED.description}"
        return Classification(COST_OPTIMIZED.name, *figures, reason)
    return Classification(
        BELOW_BASIC, *figures, f"{described}: below Basic{_why_not(passed, 'Basic')}"
    )


def _why_not(faster: list[tuple[PerformanceTier, Miss]], below: str = "") -> str:
    """Why the figures are not in a faster tier: the fastest one whose latency they meet
    (only its throughput floor failed), else the nearest faster one; `below`: the tier they
    fall below, named once."""
    if not faster:
        return ""
    on_throughput = [(tier, miss) for tier, miss in faster if miss.bound == "throughput"]
    tier, miss = on_throughput[0] if on_throughput else faster[-1]
    return f": {miss.words}" if tier.name == below else f"; not {tier.name}: {miss.words}"


def industry_position(metric: str, percentile: int, value_s: float) -> str:
    """'better than typical', 'typical' or 'worse than typical' against the article's band."""
    bands = INDUSTRY_BANDS.get(metric)
    index = {50: 0, 95: 1, 99: 2}.get(percentile)
    if bands is None or index is None or not math.isfinite(value_s):
        return "no industry figure"
    low, high = bands[index]
    if percentile == 95 and value_s < WORLD_CLASS_P95[metric]:
        return "world class"
    if value_s < low:
        return "better than typical"
    return "typical" if value_s <= high else "worse than typical"


def _describe(ttft: float | None, tpot: float | None, tokens_per_s: float | None) -> str:
    parts = []
    if _known(ttft):
        parts.append(f"p95 TTFT {ttft * 1e3:.0f} ms")  # type: ignore[operator]
    if _known(tpot):
        parts.append(f"p95 TPOT {tpot * 1e3:.1f} ms")  # type: ignore[operator]
    if _known(tokens_per_s):
        parts.append(f"{tokens_per_s:.0f} tokens/s")
    return ", ".join(parts)
