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


# Fastest first: an observation belongs to the first tier whose bounds it meets.
LATENCY_TIERS: tuple[PerformanceTier, ...] = (
    PerformanceTier("Ultra Low Latency", 0.100, 0.020, 0.0, "TTFT < 100 ms, TPOT < 20 ms"),
    PerformanceTier("High Performance", 0.200, 0.030, 1000.0, "TTFT 100-200 ms, TPOT 20-30 ms"),
    PerformanceTier("Optimized", 0.500, 0.050, 500.0, "TTFT 200-500 ms, TPOT 30-50 ms"),
    PerformanceTier("Basic", 2.0, 0.100, 100.0, "TTFT 500 ms-2 s, TPOT 50-100 ms"),
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


def classify(
    ttft_p95_s: float | None, tpot_p95_s: float | None, tokens_per_s: float | None
) -> Classification:
    """The fastest latency tier both p95 TTFT and p95 TPOT meet.

    A deployment slower than Basic on TTFT but within 5 s and above 2000 tokens/s is Cost
    Optimized: it traded latency for throughput on purpose. Unknown figures are not held
    against a tier (a non-streaming run has no TPOT).
    """

    def meets(tier: PerformanceTier) -> bool:
        ttft_ok = not _known(ttft_p95_s) or ttft_p95_s <= tier.ttft_max_s  # type: ignore[operator]
        tpot_ok = not _known(tpot_p95_s) or tpot_p95_s <= tier.tpot_max_s  # type: ignore[operator]
        return ttft_ok and tpot_ok

    figures = _describe(ttft_p95_s, tpot_p95_s, tokens_per_s)
    if not _known(ttft_p95_s) and not _known(tpot_p95_s):
        return Classification("unknown", ttft_p95_s, tpot_p95_s, tokens_per_s, "no TTFT or TPOT")
    high_throughput = _known(tokens_per_s) and tokens_per_s > COST_OPTIMIZED.min_tokens_per_s  # type: ignore[operator]
    for tier in LATENCY_TIERS:
        if meets(tier):
            if tier.name == "Basic" and high_throughput:
                break  # slow-ish latency bought with throughput: say so
            return Classification(
                tier.name, ttft_p95_s, tpot_p95_s, tokens_per_s, f"{figures}: {tier.description}"
            )
    if high_throughput and meets(COST_OPTIMIZED):
        return Classification(
            COST_OPTIMIZED.name,
            ttft_p95_s,
            tpot_p95_s,
            tokens_per_s,
            f"{figures}: {COST_OPTIMIZED.description}",
        )
    return Classification(
        BELOW_BASIC,
        ttft_p95_s,
        tpot_p95_s,
        tokens_per_s,
        f"{figures}: slower than Basic (TTFT <= 2 s, TPOT <= 100 ms)",
    )


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
