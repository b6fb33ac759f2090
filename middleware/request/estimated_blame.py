"""Estimated blame in front of any engine (docs/blame.md, "Estimated blame"): who made a
request wait, read off what the middleware sees of every request it measures (arrival, first
token, the times of the chunks that carried tokens, the end), with no help from the engine.

- **queue**: the request's wait (its `queue_s`, or `queue_prefill_s` where the engine reports
  no prefill), ending where its prefill began, split over time among the requests in flight
  ahead of it (arrived earlier, not yet ended), equally at each instant; time with nobody
  ahead is culprit `none`.
- **interference**: each gap between its token chunks beyond its median gap (its decode-only
  step, as it read), for the gaps that overlap other requests' prefill, split among those by
  the overlap. A prefill runs from the engine's start on it (its first token less its
  `prefill_s`, where the engine reported one) or else from its arrival, to its first token
  (still open for a request with none yet).

The sums hold as in the exact blame: queue blame sums to the wait, interference plus the
decode-only cost to the decode time (first to last token chunk). Nothing estimates
preemption. The result has the record's `delay_blame` shape with `"estimated": true`.
"""

from __future__ import annotations

import itertools
import statistics
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slo.engine_slis import NO_CULPRIT
from slo.records import TOP_CULPRITS

if TYPE_CHECKING:
    from middleware.request.timeline import Breakdown, RequestTimeline

NS = 1e-9
OPEN = 1 << 62  # an interval with no end yet (a prefill or a request still in flight)
MAX_ENDED = 4096  # ended requests kept for the ones still in flight (oldest dropped first)


@dataclass(slots=True)
class Seen:
    """One request as the estimate reads it, in the clock's nanoseconds."""

    request_id: str
    tier: str
    arrival_ns: int
    timeline: RequestTimeline | None  # while in flight: read live
    prefill_start_ns: int | None = None  # known once it ended with a prefill_s
    first_token_ns: int | None = None
    end_ns: int = OPEN

    def prefill(self) -> tuple[int, int]:
        """(start, end) of its prefill as known now (end OPEN before its first token)."""
        first = self.first_token_ns
        timeline = self.timeline
        if first is None and timeline is not None:
            first = timeline.first_token_byte_ns
        start = self.prefill_start_ns if self.prefill_start_ns is not None else self.arrival_ns
        return start, OPEN if first is None else first


class BlameEstimator:
    """The requests in flight and those that ended while some still were, and each
    request's estimated blame as it is reported."""

    def __init__(self) -> None:
        self._in_flight: dict[int, Seen] = {}  # id(timeline) -> the request
        self._ended: deque[Seen] = deque(maxlen=MAX_ENDED)

    def begin(self, timeline: RequestTimeline, tier: str) -> None:
        seen = Seen(timeline.request_id, tier, timeline.start_ns, timeline)
        self._in_flight[id(timeline)] = seen

    def estimate(
        self, timeline: RequestTimeline, breakdown: Breakdown, wanted: bool = True
    ) -> dict[str, Any] | None:
        """The request's blame (None for one never begun here, or not `wanted`: it failed, or
        the engine blamed it exactly), and it leaves the in-flight set: it stays as a culprit
        for the requests that overlapped it."""
        seen = self._in_flight.pop(id(timeline), None)
        if seen is None:
            return None
        first = timeline.first_token_byte_ns
        seen.first_token_ns = first
        seen.end_ns = timeline.last_byte_ns or timeline.clock.now_ns()
        if first is not None and breakdown.prefill_s is not None:
            seen.prefill_start_ns = max(first - round(breakdown.prefill_s / NS), seen.arrival_ns)
        seen.timeline = None
        blame = None
        if wanted:
            others = [*self._in_flight.values(), *self._ended]
            blame = estimate_blame(seen, timeline.token_chunk_ns, _wait_s(breakdown), others)
        self._ended.append(seen)
        self._forget_old()
        return blame

    def _forget_old(self) -> None:
        """Drop the ended requests that ended before every request in flight arrived."""
        oldest = min((seen.arrival_ns for seen in self._in_flight.values()), default=OPEN)
        ended = self._ended
        while ended and ended[0].end_ns < oldest:
            ended.popleft()


def _wait_s(breakdown: Breakdown) -> float:
    if breakdown.queue_s is not None:
        return breakdown.queue_s
    return breakdown.queue_prefill_s or 0.0


class _Tally:
    """Seconds by (cause, culprit tier) with their culprits, and by culprit request."""

    def __init__(self) -> None:
        self.by_tier: dict[tuple[str, str], float] = {}
        self.culprits: dict[tuple[str, str], set[str]] = {}
        self.by_request: dict[tuple[str, str], tuple[str, float]] = {}

    def add(self, cause: str, culprit: Seen | None, seconds: float) -> None:
        tier = NO_CULPRIT if culprit is None else culprit.tier
        key = (cause, tier)
        self.by_tier[key] = self.by_tier.get(key, 0.0) + seconds
        names = self.culprits.setdefault(key, set())
        if culprit is not None:
            names.add(culprit.request_id)
            request_key = (cause, culprit.request_id)
            _, before = self.by_request.get(request_key, (tier, 0.0))
            self.by_request[request_key] = (tier, before + seconds)

    def entries(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        culprits = self.culprits
        by_tier = [
            {"cause": cause, "tier": tier, "s": seconds, "requests": len(culprits[cause, tier])}
            for (cause, tier), seconds in self.by_tier.items()
        ]
        ranked = sorted(self.by_request.items(), key=lambda item: -item[1][1])[:TOP_CULPRITS]
        top = [
            {"cause": cause, "request_id": request_id, "tier": tier, "s": seconds}
            for (cause, request_id), (tier, seconds) in ranked
        ]
        return by_tier, top


def estimate_blame(
    request: Seen, token_chunk_ns: list[int], wait_s: float, others: list[Seen]
) -> dict[str, Any]:
    """The `delay_blame` of `request` against the `others` it may have waited for."""
    tally = _Tally()
    _queue_blame(request, wait_s, others, tally)
    decode_ns, interference = _interference_blame(request, token_chunk_ns, others, tally)
    by_tier, top = tally.entries()
    decode_s = decode_ns * NS
    return {
        "queue_s": wait_s,
        "preempted_s": 0.0,
        "decode_s": decode_s,
        "decode_only_s": max(decode_s - interference, 0.0),
        "interference_s": interference,
        "by_tier": by_tier,
        "top": top,
        "estimated": True,
    }


def _queue_blame(request: Seen, wait_s: float, others: list[Seen], tally: _Tally) -> None:
    """The wait split over time among the requests in flight ahead of it."""
    if wait_s <= 0:
        return
    wait_end = request.prefill()[0] if request.prefill_start_ns is not None else None
    if wait_end is None:
        first = request.first_token_ns
        wait_end = first if first is not None else request.end_ns
    wait_start = wait_end - round(wait_s / NS)
    ahead = [
        other
        for other in others
        if other.arrival_ns < request.arrival_ns and other.end_ns > wait_start
    ]
    ahead.sort(key=lambda other: other.end_ns)
    at, left = wait_start, len(ahead)
    for index, other in enumerate([*ahead, None]):
        until = wait_end if other is None else min(other.end_ns, wait_end)
        if until > at:
            span_s = (until - at) * NS
            if left:
                for culprit in ahead[index:]:
                    tally.add("queue", culprit, span_s / left)
            else:
                tally.add("queue", None, span_s)
            at = until
        left -= 1
        if at >= wait_end:
            break


def _interference_blame(
    request: Seen, token_chunk_ns: list[int], others: list[Seen], tally: _Tally
) -> tuple[int, float]:
    """(decode time in ns, interference in seconds): each slow gap's excess over the median
    gap, split among the other requests' prefills it overlaps, by the overlap."""
    first = request.first_token_ns
    chunks = [at for at in token_chunk_ns if first is None or at >= first]
    if len(chunks) < 2:
        return 0, 0.0
    gaps = [(a, b) for a, b in itertools.pairwise(chunks) if b > a]
    if not gaps:
        return chunks[-1] - chunks[0], 0.0
    median_ns = statistics.median(b - a for a, b in gaps)
    prefills = [other.prefill() for other in others]
    interference = 0.0
    for a, b in gaps:
        excess_ns = (b - a) - median_ns
        if excess_ns <= 0:
            continue
        overlaps = [
            (other, min(b, end) - max(a, start))
            for other, (start, end) in zip(others, prefills, strict=True)
            if start < b and end > a
        ]
        total = sum(length for _, length in overlaps)
        if not total:
            continue
        for other, length in overlaps:
            tally.add("interference", other, excess_ns * NS * length / total)
        interference += excess_ns * NS
    return chunks[-1] - chunks[0], interference
