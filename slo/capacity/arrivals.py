"""Arrival processes for open-loop load, and how well a client kept to its schedule.

Three processes, each with mean inter-arrival 1 / rate:
- constant: every gap exactly 1 / rate (a deterministic load; a server's knee is sharpest here);
- poisson: exponential gaps (memoryless users);
- gamma: gamma gaps with shape `burstiness` (vLLM's `--burstiness`): 1 is Poisson, below 1 the
  gaps' coefficient of variation 1/sqrt(burstiness) grows and requests come in bursts, above 1
  arrivals get more regular.

Every draw comes from the caller's `random.Random`, so a seed fixes the schedule.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from slo.errors import UsageError

ArrivalKind = Literal["constant", "poisson", "gamma"]
ARRIVALS: tuple[ArrivalKind, ...] = ("constant", "poisson", "gamma")


def check_arrival(kind: str, rate: float, burstiness: float) -> None:
    if kind not in ARRIVALS:
        raise UsageError(f"--arrival {kind!r}: unknown process; use one of {', '.join(ARRIVALS)}")
    if not rate > 0 or not math.isfinite(rate):
        raise UsageError(f"--rate must be a finite number > 0, got {rate}")
    if not burstiness > 0 or not math.isfinite(burstiness):
        raise UsageError(f"--burstiness must be > 0 (1 is Poisson), got {burstiness}")
    if burstiness != 1.0 and kind != "gamma":
        raise UsageError(f"--burstiness {burstiness:g} needs --arrival gamma (got {kind})")


def next_gap(rng: random.Random, kind: ArrivalKind, rate: float, burstiness: float = 1.0) -> float:
    """One inter-arrival time in seconds."""
    if kind == "constant":
        return 1.0 / rate
    if kind == "poisson":
        return rng.expovariate(rate)
    # Gamma with shape k and scale 1 / (rate k): mean 1 / rate, variance 1 / (rate^2 k).
    return rng.gammavariate(burstiness, 1.0 / (rate * burstiness))


def offsets(
    rng: random.Random, count: int, kind: ArrivalKind, rate: float, burstiness: float = 1.0
) -> list[float]:
    """Send times of `count` requests, seconds after the start; the first at 0."""
    times = [0.0]
    for _ in range(count - 1):
        times.append(times[-1] + next_gap(rng, kind, rate, burstiness))
    return times[:count]


# A client is behind its schedule when the server did not get the asked load: its achieved
# send rate fell below BEHIND_RATE_SHARE of the asked one, or sends were late as a rule
# (median over BEHIND_MEDIAN_GAPS of the mean gap), or bunched often (p99 over BEHIND_P99_GAPS
# gaps: more than two requests sent as one, in more than 1% of sends). A knee measured then
# would be the client's, not the server's. A lone stall of a shared machine is reported, not
# counted.
BEHIND_RATE_SHARE = 0.95
BEHIND_MEDIAN_GAPS = 0.25
BEHIND_P99_GAPS = 2.0


@dataclass(frozen=True, slots=True)
class Lateness:
    """How late the client sent, seconds after each request's scheduled time."""

    sends: int
    p50_s: float
    p99_s: float
    max_s: float
    achieved_rate: float | None  # sends over the span from the first to the last send
    asked_rate: float | None

    @property
    def behind(self) -> bool:
        if self.asked_rate is None or self.sends < 2:
            return False
        gap = 1.0 / self.asked_rate
        late = self.p50_s > BEHIND_MEDIAN_GAPS * gap or self.p99_s > BEHIND_P99_GAPS * gap
        slow = (self.achieved_rate or 0.0) < BEHIND_RATE_SHARE * self.asked_rate
        return late or slow

    def describe(self) -> str:
        text = (
            f"send lateness p50 {self.p50_s * 1e3:.2f} ms, p99 {self.p99_s * 1e3:.2f} ms, "
            f"max {self.max_s * 1e3:.2f} ms"
        )
        if self.asked_rate is not None and self.achieved_rate is not None:
            text += f"; sent {self.achieved_rate:.2f} req/s of {self.asked_rate:.2f} asked"
        if self.behind:
            text += " -- the client fell behind its schedule: this run's load is not the asked one"
        return text

    def to_dict(self) -> dict[str, float | int | bool | None]:
        return {
            "sends": self.sends,
            "p50_ms": round(self.p50_s * 1e3, 4),
            "p99_ms": round(self.p99_s * 1e3, 4),
            "max_ms": round(self.max_s * 1e3, 4),
            "achieved_rate": self.achieved_rate,
            "asked_rate": self.asked_rate,
            "behind": self.behind,
        }


def lateness_of(
    late_s: Sequence[float], sent_at: Sequence[float], asked_rate: float | None
) -> Lateness:
    """Summarize per-send lateness (nearest rank) and the achieved rate of the sends."""
    if not late_s:
        return Lateness(0, 0.0, 0.0, 0.0, None, asked_rate)
    ordered = sorted(late_s)

    def rank(q: float) -> float:
        return ordered[max(1, math.ceil(q * len(ordered))) - 1]

    span = max(sent_at) - min(sent_at) if sent_at else 0.0
    achieved = (len(sent_at) - 1) / span if span > 0 else None
    return Lateness(len(ordered), rank(0.50), rank(0.99), ordered[-1], achieved, asked_rate)
