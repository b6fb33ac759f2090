"""`slo plan`'s arithmetic: replicas for a target load, their cost, and what changed between
capacity runs. Every number comes from a capacity.json and the stated inputs:

- usable capacity of one replica = max_rate x (1 - headroom): the headroom is the share of
  each replica kept free at the target (for bursts, a replica lost, the next deploy);
- replicas = ceil(target rate / usable capacity), at least 1;
- achieved headroom = 1 - target / (replicas x max_rate);
- cost per hour = replicas x price per replica-hour;
- cost per million output tokens = cost per hour / (target rate x mean output tokens x 3600)
  x 1e6, and its floor, one replica at max_rate: price / (max_rate x tokens x 3600) x 1e6;
- a diurnal profile (hour -> rate, each rate holding until the next hour given, wrapping at
  midnight) needs replicas(hour) each hour: replica-hours a day is their sum, against the
  peak's replicas held for 24 hours.

A capacity.json measured one tier mix: its max_rate holds for that mix. A target with another
mix is planned at its total rate, with a warning to measure that mix (`--tier-mix`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slo.errors import UsageError
from slo.tier_numbers import parse_tier_numbers

MIX_TOLERANCE = 0.10  # a target tier share this far from the measured one gets a warning


@dataclass(frozen=True)
class Replicas:
    target_rps: float
    max_rate: float
    headroom: float
    replicas: int

    @property
    def achieved_headroom(self) -> float:
        return 1.0 - self.target_rps / (self.replicas * self.max_rate)


def replicas_for(target_rps: float, max_rate: float, headroom: float) -> Replicas:
    if not max_rate > 0:
        raise UsageError("capacity.json: max_rate is not > 0; no load passed, nothing to plan")
    if not 0 <= headroom < 1:
        raise UsageError(f"--headroom must be in [0, 1), got {headroom}")
    usable = max_rate * (1.0 - headroom)
    # The ratio is rounded before its ceiling: 3.0000000000000004 replicas is 3, not 4.
    count = max(1, math.ceil(round(target_rps / usable, 9)))
    return Replicas(target_rps, max_rate, headroom, count)


@dataclass(frozen=True)
class Cost:
    per_hour: float
    per_million_output_tokens: float | None
    floor_per_million_output_tokens: float | None  # one replica busy at max_rate


def cost_of(
    plan: Replicas, price_per_replica_hour: float, mean_output_tokens: float | None
) -> Cost:
    per_hour = plan.replicas * price_per_replica_hour
    if not mean_output_tokens:
        return Cost(per_hour, None, None)
    tokens_per_hour = plan.target_rps * mean_output_tokens * 3600.0
    floor_tokens = plan.max_rate * mean_output_tokens * 3600.0
    return Cost(
        per_hour,
        per_hour / tokens_per_hour * 1e6 if tokens_per_hour > 0 else None,
        price_per_replica_hour / floor_tokens * 1e6,
    )


def parse_rates(text: str) -> dict[str, float]:
    """'premium=10,standard=30' -> {tier: requests/s}."""
    rates = dict(parse_tier_numbers(text, "--rate", "TIER=REQUESTS_PER_S; e.g. premium=10"))
    if not rates or sum(rates.values()) <= 0:
        raise UsageError("--rate: give at least one tier with a rate > 0")
    return rates


_HOUR = re.compile(r"^(\d{1,2})(?::00)?=(\d+(?:\.\d+)?)$")


def parse_diurnal(text: str) -> list[tuple[int, float]]:
    """'0=10,8=50,20=20' (hour=rate, each holding until the next) -> sorted points."""
    points: dict[int, float] = {}
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        match = _HOUR.match(part)
        if match is None or int(match.group(1)) > 23:
            raise UsageError(f"--diurnal: {part!r} is not HOUR=RATE with HOUR 0-23; e.g. 0=10,8=50")
        points[int(match.group(1))] = float(match.group(2))
    if not points:
        raise UsageError("--diurnal: give at least one HOUR=RATE")
    return sorted(points.items())


def hourly(points: Sequence[tuple[int, float]]) -> list[float]:
    """The rate of each of the 24 hours: each point holds until the next, wrapping round."""
    rates = []
    for hour in range(24):
        earlier = [rate for start, rate in points if start <= hour]
        rates.append(earlier[-1] if earlier else points[-1][1])
    return rates


@dataclass(frozen=True)
class Day:
    replicas_by_hour: list[int]
    peak_replicas: int
    replica_hours: int

    @property
    def static_replica_hours(self) -> int:
        return self.peak_replicas * 24


def plan_day(points: Sequence[tuple[int, float]], max_rate: float, headroom: float) -> Day:
    counts = [replicas_for(rate, max_rate, headroom).replicas for rate in hourly(points)]
    return Day(counts, max(counts), sum(counts))


def mix_warnings(target: Mapping[str, float], measured: Mapping[str, float]) -> list[str]:
    total = sum(target.values())
    warnings = []
    for tier in sorted(set(target) | set(measured)):
        share, had = target.get(tier, 0.0) / total, measured.get(tier, 0.0)
        if abs(share - had) > MIX_TOLERANCE:
            warnings.append(
                f"tier {tier}: {share:.0%} of the target but {had:.0%} of the measured mix; "
                f"the plan assumes the measured mix: measure yours with --tier-mix"
            )
    return warnings


def knobs(document: Mapping[str, Any]) -> dict[str, Any]:
    """The engine settings a capacity run was measured under (what /v1/models said and the
    `slo serve` flags of --embedded)."""
    engine = document.get("engine") or {}
    args = [str(arg) for arg in engine.get("serve_args") or ()]
    quantization = _flag(args, "--quantization") or ("none" if "policy" in engine else None)
    batch = _flag(args, "--max-batch-size") or engine.get("max_batch_size")
    return {
        "quantization": quantization,
        "scheduling": _flag(args, "--scheduling") or engine.get("policy"),
        "max_batch_size": int(batch) if batch else None,
    }


def _flag(args: Sequence[str], name: str) -> str | None:
    for index, arg in enumerate(args):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name and index + 1 < len(args):
            return args[index + 1]
    return None


def mean_output_tokens(document: Mapping[str, Any]) -> float | None:
    """Mean output tokens of the passing step at max_rate (the load the plan scales)."""
    key = "rate" if document.get("mode") == "rate" else "concurrency"
    best = document.get("max_rate" if key == "rate" else "max_concurrency")
    for step in document.get("steps", []):
        if step.get(key) == best and step.get("verdict") == "pass":
            value = step.get("mean_output_tokens")
            return float(value) if value else None
    return None
