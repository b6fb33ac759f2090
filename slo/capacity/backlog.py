"""Did the server keep up? The backlog of an open-loop step, from the client's own times.

A step at a rate above what the server finishes is not at steady state: requests arrive faster
than they leave, so the number in flight grows for as long as the step lasts, and every
latency grows with it. Over a short measured window such a step can still pass (the queue has
not yet reached the SLO's threshold), and a longer run at the same rate then fails: a knee
reported there would be false. So a step passes only if the server kept up over its measured
window: the requests in flight when the last measured request was sent exceed those in
flight when the first was sent by at most

    GROWTH_SHARE x (requests sent in between)  +  GROWTH_SIGMAS x sqrt(mean in flight)

The first term is the overload a search cannot resolve anyway (its resolution, 5%); the
second is the count's own noise at steady state (the number in flight of an M/G/infinity
queue is Poisson: its standard deviation is the square root of its mean). A server over its
capacity by the share x adds x x sent.

In flight at time t: requests sent at or before t (warm-up ones included) less those finished
at or before t; a request that never finished counts as in flight until the end.

It is judged per tier: with tier priorities the server may keep up with premium while
standard's queue grows. A tier that fell behind fails the step on a pseudo-objective,
STEADY_STATE, whose severity is its growth over the allowed growth; it binds the tier when
no objective of the spec failed further past its bound.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slo.capacity.judge import TierStep

STEADY_STATE = "steady state: requests in flight must not grow"
GROWTH_SHARE = 0.05
GROWTH_SIGMAS = 3.0


@dataclass(frozen=True, slots=True)
class Backlog:
    at_start: int  # in flight at the first measured send
    at_end: int  # in flight at the last measured send
    sent: int  # requests sent from the first measured send to the last
    mean_in_flight: float  # over the measured sends

    @property
    def growth(self) -> int:
        return self.at_end - self.at_start

    @property
    def allowed_growth(self) -> float:
        return GROWTH_SHARE * self.sent + GROWTH_SIGMAS * math.sqrt(max(self.mean_in_flight, 1.0))

    @property
    def kept_up(self) -> bool:
        return self.growth <= self.allowed_growth

    def describe(self) -> str:
        return (
            f"in flight {self.at_start} -> {self.at_end} over {self.sent} measured sends "
            f"(mean {self.mean_in_flight:.1f}; allowed growth {self.allowed_growth:.0f})"
            + ("" if self.kept_up else ": the server fell behind the arrivals (not steady)")
        )

    def to_dict(self) -> dict[str, float | int | bool]:
        return {
            "in_flight_at_start": self.at_start,
            "in_flight_at_end": self.at_end,
            "sent": self.sent,
            "mean_in_flight": round(self.mean_in_flight, 2),
            "growth": self.growth,
            "allowed_growth": round(self.allowed_growth, 2),
            "kept_up": self.kept_up,
        }


def backlog_of(
    sends: Sequence[float], finishes: Sequence[float], window: tuple[float, float]
) -> Backlog | None:
    """The backlog over `window` (first and last measured send times), from every request's
    send time and the finish times of those that finished (one clock); None without a window."""
    start, end = window
    if not sends or end <= start:
        return None
    sent = sorted(sends)
    done = sorted(finishes)

    def in_flight(t: float) -> int:
        return bisect.bisect_right(sent, t) - bisect.bisect_right(done, t)

    measured = [t for t in sent if start <= t <= end]
    mean = sum(in_flight(t) for t in measured) / len(measured)
    return Backlog(in_flight(start), in_flight(end), len(measured) - 1, mean)


def judge_backlogs(tiers: dict[str, TierStep], backlogs: dict[str, Backlog]) -> None:
    """Fail, in place, each tier of `tiers` whose server fell behind its arrivals."""
    for name, backlog in backlogs.items():
        tier = tiers.get(name)
        if tier is None or backlog.kept_up:
            continue
        objective: dict[str, Any] = {
            "objective": STEADY_STATE,
            "verdict": "violated",
            "observed_s": None,
            "threshold_s": None,
            "attainment": None,
            "target": None,
            "severity": round(backlog.growth / max(backlog.allowed_growth, 1e-9), 6),
            "backlog": backlog.to_dict(),
        }
        tiers[name] = dataclasses.replace(
            tier, verdict="fail", objectives=[*tier.objectives, objective]
        )
