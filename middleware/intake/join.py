"""Join engine request spans to the wire records, exactly once.

Engines export spans in batches: a request's span can come seconds after its response ended,
before it, twice, or never. A finished request's report (record, histograms, live windows)
is therefore *settled* here:

- its span is already held (it came first): reported at once with the engine's phases;
- spans are expected and it has not come: the report waits, at most `wait_s`, and goes out
  with the span when it comes, or without it (`queue_prefill` as before) when the wait ends;
- no span is expected: reported at once, as before.

Spans are expected when `expect` is "always", or, with "auto" (the default), once this
process has received an engine span in the last `AUTO_WINDOW_S`: an engine that exports none
never delays a report. A span waits for its request at most `hold_s`, and at most `max_held`
spans wait at once (the oldest dropped first); a second span for a joined request is dropped.
Every dropped span is counted.

An engine that times its stages in child spans of the request span (SGLang) sends those too:
they are summed by stage name under their trace id (held as spans are, at most `hold_s` and
`max_held` traces) and go with the request span when it joins (`with_stages`: queue, prefill
and decode from the stages). They end before their request span, so an exporter sends them
first or in the same export; one that comes after its request was reported is unmatched.

Keys: the trace id (the proxy sends the engine a `traceparent` of its own span), or the
request id the engine reports (`X-Request-Id`, which vLLM may prefix, e.g. `chatcmpl-<id>`).
A span is only worth reading when a request of ours is under one of its keys, in flight
(`begin` .. `end`), waiting, or already joined (a duplicate): `wanted` tells the intake
before it decodes the span's attributes, and counts the rest as unmatched at once (an
engine exports every request's span, also those of clients that bypass us).
Single-threaded: call it from the event loop that serves the requests.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from middleware.upstream import SpanPhases, with_stages

logger = logging.getLogger("middleware.intake")

# With expect="auto", reports wait for spans while the last engine span is this recent.
AUTO_WINDOW_S = 600.0
EXPECT_MODES = ("auto", "always", "never")

Report = Callable[[SpanPhases | None], None]


@dataclass
class JoinCounts:
    spans: int = 0  # engine request spans received
    joined: int = 0  # spans that gave their request its phases
    duplicates: int = 0  # spans for a request already joined: dropped
    unmatched: int = 0  # spans dropped: no request came within hold_s, or too many held
    waited_in_vain: int = 0  # reports that waited wait_s and went out without a span
    rejected: int = 0  # exports that could not be read (answered 400)


@dataclass(slots=True)
class _Waiting:
    deadline: float
    report: Report
    request_id: str | None


@dataclass(slots=True)
class _Stages:
    """One trace's stage spans, until its request span joins: seconds summed by stage name."""

    at: float
    seconds: dict[str, float] = field(default_factory=dict)
    count: int = 0


class Relay(Protocol):
    """Hands spans to the other workers of the server (`middleware.intake.relay`)."""

    def owner(self, trace_id: str, request_id: str | None) -> str | None: ...

    def forward(self, spans: list[SpanPhases]) -> None: ...

    def saw_spans(self) -> None: ...


class SpanJoin:
    def __init__(
        self,
        wait_s: float = 10.0,
        *,
        hold_s: float = 60.0,
        max_held: int = 10_000,
        expect: Literal["auto", "always", "never"] = "auto",
        now: Callable[[], float] = time.monotonic,
        intake: bool = True,
    ) -> None:
        if expect not in EXPECT_MODES:
            raise ValueError(f"expect={expect!r}: use one of {', '.join(EXPECT_MODES)}")
        if wait_s < 0 or hold_s <= 0 or max_held < 1:
            raise ValueError(
                f"wait_s={wait_s}, hold_s={hold_s}, max_held={max_held}: the wait must be "
                ">= 0 s, the hold > 0 s and at least one span held"
            )
        self.wait_s = wait_s
        self.hold_s = hold_s
        self.max_held = max_held
        self.expect = expect
        self.now = now
        self.counts = JoinCounts()
        self._last_span_at: float | None = None
        self._waiting: OrderedDict[str, _Waiting] = OrderedDict()  # trace id -> report
        self._waiting_by_request: dict[str, str] = {}  # request id -> trace id
        self._held: OrderedDict[str, tuple[float, SpanPhases]] = OrderedDict()  # early spans
        self._held_by_request: dict[str, str] = {}
        self._joined: OrderedDict[str, None] = OrderedDict()  # recent trace ids, for duplicates
        # Stage spans (`SpanPhases.stage`) by trace id: when the first came, seconds by stage.
        self._stages: OrderedDict[str, _Stages] = OrderedDict()
        self._in_flight: dict[str, int] = {}  # trace id -> requests of ours under it, running
        self._in_flight_requests: dict[str, int] = {}  # their request ids
        # With several workers: spans of another worker's requests go there, not unmatched.
        self.relay: Relay | None = None
        # Spans reach this process at an intake (`POST /v1/traces`); with none and no relay,
        # no span can come and requests skip the join (`Reporter.join_keys`).
        self.intake = intake

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def held(self) -> int:
        return len(self._held)

    def begin(self, trace_id: str, request_id: str | None) -> None:
        """A request of ours started under these keys: its span may come before it ends."""
        self._in_flight[trace_id] = self._in_flight.get(trace_id, 0) + 1
        if request_id:
            self._in_flight_requests[request_id] = self._in_flight_requests.get(request_id, 0) + 1

    def end(self, trace_id: str, request_id: str | None) -> None:
        """That request ended (it is settled next: reported, or waiting)."""
        # Counts of requests under a key (usually one): the key goes with the last.
        left = self._in_flight.pop(trace_id, 1) - 1
        if left > 0:
            self._in_flight[trace_id] = left
        if request_id:
            left = self._in_flight_requests.pop(request_id, 1) - 1
            if left > 0:
                self._in_flight_requests[request_id] = left

    def wanted(self, trace_id: str, request_id: str | None) -> bool:
        """Whether an engine span under these keys can join a request of ours (in flight,
        waiting, or joined: a duplicate); one that cannot is counted unmatched here."""
        self._last_span_at = self.now()  # the engine exports spans
        if self._known(trace_id, request_id):
            return True
        if self.relay is not None and self.relay.owner(trace_id, request_id) is not None:
            return True  # read, then handed to the worker whose request it is (`add`)
        self.counts.spans += 1
        self.counts.unmatched += 1
        return False

    def _known(self, trace_id: str, request_id: str | None) -> bool:
        """A request of ours is under these keys (in flight, waiting, joined), or an early
        span is held under them (a second copy is counted as a duplicate by `add`)."""
        if trace_id in self._in_flight or trace_id in self._waiting or trace_id in self._joined:
            return True
        if trace_id in self._held or trace_id in self._stages:
            return True
        for key in request_keys(request_id):
            if key in self._in_flight_requests or key in self._waiting_by_request:
                return True
        return False

    def note_spans_seen(self) -> None:
        """Another worker received engine spans: reports here wait for theirs too."""
        self._last_span_at = self.now()

    def may_wait(self) -> bool:
        """Whether `settle` might hold a report (an early span is held, or spans are expected
        and waited for); when not, it reports at once, and the caller may report directly."""
        if self._held:
            return True
        if self.wait_s == 0 or (self.expect == "auto" and self._last_span_at is None):
            return False  # no wait, or no engine ever sent a span (`expects_spans`, at once)
        return self.expects_spans()

    def expects_spans(self) -> bool:
        if self.expect != "auto":
            return self.expect == "always"
        last = self._last_span_at
        return last is not None and self.now() - last < AUTO_WINDOW_S

    def settle(self, trace_id: str, request_id: str | None, report: Report) -> float | None:
        """Report one finished request now, or hold it for its span: the seconds it may wait
        (call `expire` then), or None when it was reported."""
        span = self._take_held(trace_id, request_id) if self._held else None
        if span is not None:
            self._joined_now(trace_id)
            _safely(report, self._with_stages(span))
            return None
        if not self.expects_spans() or self.wait_s == 0 or trace_id in self._waiting:
            _safely(report, None)
            return None
        self._waiting[trace_id] = _Waiting(self.now() + self.wait_s, report, request_id)
        if request_id:
            self._waiting_by_request[request_id] = trace_id
        return self.wait_s

    def add(self, spans: list[SpanPhases], *, relayed: bool = False) -> None:
        """Engine spans from one export (`relayed`: handed here by another worker)."""
        now = self.now()
        relay = None if relayed else self.relay
        if relay is not None:
            relay.saw_spans()
            theirs = [s for s in spans if not self._known(s.trace_id, s.request_id)]
            theirs = [s for s in theirs if relay.owner(s.trace_id, s.request_id) is not None]
            if theirs:
                relay.forward(theirs)  # counted by the worker they reach
                forwarded = {id(span) for span in theirs}
                spans = [span for span in spans if id(span) not in forwarded]
        for span in spans:
            self.counts.spans += 1
            self._last_span_at = now
            if span.stage is not None:
                self._add_stage(span, now)
                continue
            trace_id = self._waiting_trace(span)
            if trace_id is not None:
                waiting = self._waiting.pop(trace_id)
                if waiting.request_id:
                    self._waiting_by_request.pop(waiting.request_id, None)
                self._joined_now(trace_id)
                _safely(waiting.report, self._with_stages(span))
            elif span.trace_id in self._joined:
                self.counts.duplicates += 1
            else:
                self._hold(span, now)
        self._drop_stale(now)

    def expire(self) -> float | None:
        """Report the requests whose wait is over without a span; drop stale spans. The
        seconds until the next wait ends, if one is left (a timer can fire a little early:
        uvloop's run on the loop's cached millisecond clock)."""
        now = self.now()
        while self._waiting:
            trace_id, waiting = next(iter(self._waiting.items()))
            if waiting.deadline > now:
                self._drop_stale(now)
                return waiting.deadline - now
            del self._waiting[trace_id]
            if waiting.request_id:
                self._waiting_by_request.pop(waiting.request_id, None)
            self.counts.waited_in_vain += 1
            _safely(waiting.report, None)
        self._drop_stale(now)
        return None

    def close(self) -> None:
        """Shutdown: every waiting request is reported without its span."""
        while self._waiting:
            _trace_id, waiting = self._waiting.popitem(last=False)
            self.counts.waited_in_vain += 1
            _safely(waiting.report, None)
        self._waiting_by_request.clear()
        self.counts.unmatched += sum(held.count for held in self._stages.values())
        self._stages.clear()

    def _waiting_trace(self, span: SpanPhases) -> str | None:
        if span.trace_id in self._waiting:
            return span.trace_id
        for request_id in request_keys(span.request_id):
            trace_id = self._waiting_by_request.get(request_id)
            if trace_id is not None:
                return trace_id
        return None

    def _take_held(self, trace_id: str, request_id: str | None) -> SpanPhases | None:
        key = trace_id if trace_id in self._held else None
        if key is None and request_id:
            key = self._held_by_request.get(request_id)
        if key is None:
            return None
        _at, span = self._held.pop(key)
        for held_request in request_keys(span.request_id):
            self._held_by_request.pop(held_request, None)
        return span

    def _hold(self, span: SpanPhases, now: float) -> None:
        if span.trace_id in self._held:
            self.counts.duplicates += 1
            return
        self._held[span.trace_id] = (now, span)
        for request_id in request_keys(span.request_id):
            self._held_by_request[request_id] = span.trace_id
        while len(self._held) > self.max_held:
            self._drop_oldest_held()

    def _drop_stale(self, now: float) -> None:
        while self._held and next(iter(self._held.values()))[0] + self.hold_s <= now:
            self._drop_oldest_held()
        while self._stages and next(iter(self._stages.values())).at + self.hold_s <= now:
            self.counts.unmatched += self._stages.popitem(last=False)[1].count

    def _add_stage(self, span: SpanPhases, now: float) -> None:
        """One stage span: summed under its trace id until its request span joins."""
        if span.trace_id in self._joined:
            self.counts.unmatched += 1  # its request was reported already
            return
        held = self._stages.get(span.trace_id)
        if held is None:
            held = self._stages[span.trace_id] = _Stages(now)
            while len(self._stages) > self.max_held:
                self.counts.unmatched += self._stages.popitem(last=False)[1].count
        name = span.stage or ""
        held.seconds[name] = held.seconds.get(name, 0.0) + (span.stage_s or 0.0)
        held.count += 1

    def _with_stages(self, span: SpanPhases) -> SpanPhases:
        held = self._stages.pop(span.trace_id, None)
        return span if held is None else with_stages(span, held.seconds)

    def _drop_oldest_held(self) -> None:
        _trace_id, (_at, span) = self._held.popitem(last=False)
        for request_id in request_keys(span.request_id):
            self._held_by_request.pop(request_id, None)
        self.counts.unmatched += 1

    def _joined_now(self, trace_id: str) -> None:
        self.counts.joined += 1
        self._joined[trace_id] = None
        while len(self._joined) > self.max_held:
            self._joined.popitem(last=False)


def request_keys(request_id: str | None) -> tuple[str, ...]:
    """The keys an engine's request id can be found under: itself and, for an id the engine
    prefixed (vLLM's `chatcmpl-<X-Request-Id>`, `cmpl-<X-Request-Id>-0` for a prompt of a
    completion), what follows the first dash, with and without a `-<n>` suffix."""
    if not request_id:
        return ()
    prefix, dash, rest = request_id.partition("-")
    if not (dash and rest and prefix.isalpha()):
        return (request_id,)
    head, dash, index = rest.rpartition("-")
    return (request_id, rest, head) if dash and head and index.isdigit() else (request_id, rest)


def _safely(report: Report, span: SpanPhases | None) -> None:
    try:
        report(span)
    except Exception:  # reporting must never break the intake or the request
        logger.exception("llm-slo: failed to report a request")
