"""One request's timeline: marks from the HTTP side and the engine, and the breakdown derived once.

The breakdown cuts the request's critical path into consecutive segments, so the parts add up
to e2e exactly and none is negative, even though sending overlaps decoding in a stream:

    start .. receive_end .... enqueue ..... schedule .... first token .... last token .... last byte
    | network (in) |  other   |    queue    |  prefill   | decode (+detok) |  network (out)  |

- detokenize is the sum of per-token detokenization time, carved out of decode;
- a preemption after the first token (the gap from the token before it to the token after
  the re-schedule) moves from decode to queue: preemption adds queue time, not prefill time;
- with no engine hooks (any engine seen through the wire), the span from the end of the request
  body to the first token-bearing chunk is the engine's "queue_prefill" (queue and prefill, not
  split), never "other"; where the upstream tells its phases (llama.cpp's `timings`, TGI's
  headers: `middleware.upstream`), they are carved out of that span; behind `slo proxy` the
  proxy's own time before it sends upstream is "other", and reaching the upstream is network.

TTFT = first byte of the first token's chunk handed to `send` - start; e2e = end of the last
`send` - start; TPOT = (e2e - TTFT) / (output_tokens - 1); ITL = every gap between consecutive
token events: each SSE event with text is one, however the bytes arrive (a chunk whose text
holds several tokens is one event; several events in one chunk are several, 0 s apart), as
`vllm bench serve` counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import middleware.hotpath as hotpath
from middleware.clock import Clock
from middleware.request.breakdown import MEASURED_FROM_MARKS, NS, Breakdown
from middleware.upstream import UpstreamReport

__all__ = [
    "NS",
    "Breakdown",
    "RequestTimeline",
]

ENGINE_EVENTS = (
    "enqueue",
    "schedule",
    "prefill_start",
    "prefill_end",
    "token",
    "detokenize",
    "finish",
)
# Marks of a proxy in front of the engine (`slo proxy`): sending upstream, upstream reached.
PROXY_EVENTS = ("upstream_start", "upstream_connected")

_Gaps = tuple[int, int | None, tuple[float, ...]]  # count, last, gaps (s): `_gaps`


@dataclass(slots=True, eq=False)
class RequestTimeline:
    """Marks of one request, in the clock's nanoseconds. Made per request, never shared."""

    request_id: str
    clock: Clock
    start_ns: int = 0
    wall_start_s: float = 0.0
    # Where the server told the first byte (`middleware.request.arrival`).
    app_call_ns: int | None = None
    connection_accepted_ns: int | None = None
    receive_end_ns: int | None = None
    enqueue_ns: int | None = None
    schedule_ns: list[int] = field(default_factory=list)
    prefill_start_ns: int | None = None
    prefill_end_ns: int | None = None
    token_ns: list[int] = field(default_factory=list)
    detokenize_ns: int = 0
    # When each detokenization (an engine hook per token) ran: [start, end, start, end, ...].
    detokenize_marks: list[int] = field(default_factory=list)
    first_token_byte_ns: int | None = None
    last_byte_ns: int | None = None
    body_chunk_ns: list[int] = field(default_factory=list)
    # Send times of the chunks that carried a token event (text), read off the wire.
    token_chunk_ns: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    input_tokens: int = 0
    cached_tokens: int = 0
    engine_reported: bool = False
    streamed: bool = False
    upstream_start_ns: int | None = None
    upstream_connected_ns: int | None = None
    # Counts and phases the engine put on the wire (usage, timings, headers).
    upstream: UpstreamReport | None = None
    delay_blame: dict[str, Any] | None = None  # who made it wait (middleware.request.blame)
    # The sequence-derived part of the last breakdown (see `_gaps`): a response asks for its
    # breakdown twice (timings for the client, then the report), the gaps are the costly part.
    _gaps_cache: tuple[tuple[int | None, int, int | None], _Gaps] | None = field(
        default=None, init=False, repr=False
    )

    @classmethod
    def begin(cls, request_id: str, clock: Clock) -> RequestTimeline:
        return cls(
            request_id=request_id, clock=clock, start_ns=clock.now_ns(), wall_start_s=clock.wall_s()
        )

    def mark(
        self,
        event: str,
        time_ns: int | None = None,
        *,
        duration_ns: int = 0,
        tokens: int = 0,
        reason: str | None = None,
    ) -> None:
        """Record an engine phase; the public way for any engine to report (see ENGINE_EVENTS)."""
        at = self.clock.now_ns() if time_ns is None else time_ns
        if event == "upstream_start":
            self.upstream_start_ns = at
            return
        if event == "upstream_connected":
            self.upstream_connected_ns = at
            return
        if event == "token":
            self.token_ns.append(at)
        elif event == "detokenize":
            self.detokenize_ns += duration_ns
            self.detokenize_marks += (at - duration_ns, at)
        elif event == "schedule":
            self.schedule_ns.append(at)
        elif event == "enqueue":
            self.enqueue_ns = at
            self.input_tokens = tokens or self.input_tokens
        elif event == "prefill_start":
            if self.prefill_start_ns is None:
                self.prefill_start_ns = at
        elif event == "prefill_end":
            if self.prefill_end_ns is None:
                self.prefill_end_ns = at
        elif event == "finish":
            self.finish_reason = reason
        else:
            raise ValueError(
                f"unknown timeline event {event!r}; use one of "
                f"{', '.join(ENGINE_EVENTS + PROXY_EVENTS)}"
            )
        self.engine_reported = True

    # Called by the middleware around the app's receive/send.
    def body_received(self, at_ns: int) -> None:
        self.receive_end_ns = at_ns

    # A body chunk with bytes was handed to `send` at `started_ns`, holding `token_events`
    # token events (text), as the wire parser read it: `chunk_sent(started_ns, token_events=1)`.
    # Events sent in one chunk arrived together: each is a mark, with gaps of 0 between them.
    # Per chunk, so compiled where built (`middleware.hotpath`).
    chunk_sent = hotpath.chunk_sent

    def last_byte_sent(self, at_ns: int) -> None:
        """The answer's last byte so far was handed to `send` by `at_ns` (a later message
        moves it)."""
        self.last_byte_ns = at_ns

    def stream_started(self) -> None:
        """The answer is an SSE stream."""
        self.streamed = True

    def prefix_cached(self, cached_tokens: int) -> None:
        """The engine served `cached_tokens` of the prompt from its prefix cache."""
        self.cached_tokens = cached_tokens

    def take_upstream(self, report: UpstreamReport) -> UpstreamReport:
        """The counts and phases the engine put on the wire (or in its span)."""
        self.upstream = report
        return report

    def take_counts(self, input_tokens: int | None, cached_tokens: int | None) -> None:
        """Prompt counts the engine reported, where no engine hook said them."""
        if self.engine_reported:
            return
        if input_tokens is not None and not self.input_tokens:
            self.input_tokens = input_tokens
        if cached_tokens is not None and not self.cached_tokens:
            self.cached_tokens = cached_tokens

    def body_sent(self, started_ns: int, ended_ns: int, has_bytes: bool) -> None:
        """A body message handed to `send` from `started_ns` to `ended_ns`."""
        if has_bytes:
            self.chunk_sent(started_ns)
        self.last_byte_ns = ended_ns

    def count_every_chunk(self) -> None:
        """A stream the wire parser could not read (not the OpenAI format): every body chunk
        is taken as one token event, the first one as the first token."""
        self.token_chunk_ns[:] = self.body_chunk_ns  # the same list: the hot path holds it
        self.first_token_byte_ns = self.body_chunk_ns[0] if self.body_chunk_ns else None

    def breakdown(self) -> Breakdown:
        # Runs twice per request (timings for the client, then the report): clamps are two
        # conditionals (min/max parse their arguments: 10x the instructions), gaps are cached.
        start = self.start_ns
        end = self.last_byte_ns or self.clock.now_ns()
        end = end if end > start else start
        mark = self.receive_end_ns
        receive_end = start if mark is None or mark < start else mark
        receive_end = end if receive_end > end else receive_end
        if self.engine_reported and self.token_ns:
            parts = self._engine_parts(receive_end, end)
        else:
            parts = self._wire_parts(receive_end, end)
        network, queue, prefill, queue_prefill, decode, detokenize, other = parts[:7]
        output_tokens, itl, tokens_source = parts[7:]
        network += receive_end - start
        e2e = end - start
        ttft = (
            None
            if self.first_token_byte_ns is None
            else (self.first_token_byte_ns - start if self.first_token_byte_ns > start else 0) * NS
        )
        if ttft is None and output_tokens and self.last_byte_ns is not None:
            ttft = e2e * NS  # a non-streamed answer: the first token arrives with the last byte
        tpot = None
        if ttft is not None and output_tokens > 1:
            tpot = max(e2e * NS - ttft, 0.0) / (output_tokens - 1)
        breakdown = Breakdown._of(
            {
                "e2e_s": e2e * NS,
                "ttft_s": ttft,
                "tpot_s": tpot,
                "itl_s": itl,
                "network_s": network * NS,
                "queue_s": None if queue is None else queue * NS,
                "prefill_s": None if prefill is None else prefill * NS,
                "queue_prefill_s": None if queue_prefill is None else queue_prefill * NS,
                "decode_s": decode * NS,
                "detokenize_s": detokenize * NS,
                "other_s": other * NS,
                "output_tokens": output_tokens,
                "tokens_source": tokens_source,
            }
        )
        for name, measure in MEASURED_FROM_MARKS.items():
            breakdown.__dict__[name] = measure(self)
        return breakdown

    def _engine_parts(self, receive_end: int, end: int) -> tuple[Any, ...]:
        """The engine marked every phase (its hooks): (network after the body, queue, prefill,
        queue_prefill, decode, detokenize, other, output tokens, ITL, tokens source)."""
        tokens = self.token_ns
        mark = self.enqueue_ns
        enqueue = receive_end if mark is None else min(max(mark, receive_end), end)
        schedule = min(max(self.schedule_ns[0], enqueue), end) if self.schedule_ns else enqueue
        first_token = min(max(tokens[0], schedule), end)
        last_token = min(max(tokens[-1], first_token), end)
        decode_total = last_token - first_token
        preempted = min(self._preemption_gaps_ns(), decode_total)
        detokenize = min(self.detokenize_ns, decode_total - preempted)
        output_tokens, _, itl = self._gaps(tokens, None)
        return (
            end - last_token,
            schedule - enqueue + preempted,
            first_token - schedule,
            None,
            decode_total - preempted - detokenize,
            detokenize,
            enqueue - receive_end,
            output_tokens,
            itl,
            "engine",
        )

    def _wire_parts(self, receive_end: int, end: int) -> tuple[Any, ...]:
        """Seen through the wire (any engine): the same parts, the engine's phases carved out
        where it reported them (span, timings, headers)."""
        mark = self.first_token_byte_ns
        first_byte = end if mark is None else (mark if mark > receive_end else receive_end)
        first_byte = end if first_byte > end else first_byte
        output_tokens, mark, itl = self._gaps(self.token_chunk_ns, first_byte)
        last_chunk = first_byte if mark is None or mark < first_byte else mark
        last_chunk = end if last_chunk > end else last_chunk
        decode = last_chunk - first_byte
        queue_prefill = None
        report = self.upstream
        if report is not None and report.from_span:
            queue, prefill, decode, other, reach = self._engine_span_split(
                report, receive_end, last_chunk
            )
        else:
            queue, prefill, queue_prefill, other, decode_extra, reach = self._before_first_byte(
                receive_end, first_byte
            )
            decode += decode_extra
        tokens_source = "chunks"
        if report is not None and report.output_tokens is not None:
            output_tokens = report.output_tokens
            tokens_source = report.tokens_source or "usage"
        network = end - last_chunk + reach
        parts = (network, queue, prefill, queue_prefill, decode, 0, other)
        return (*parts, output_tokens, itl, tokens_source)

    def _proxy_segments(self, receive_end: int, until: int) -> tuple[int, int, int]:
        """(the engine's start, the proxy's own time, reaching the upstream): behind a proxy
        its time before it sends upstream is "other" and reaching the upstream is network."""
        other = reach = 0
        engine_start = receive_end
        mark = self.upstream_start_ns
        if mark is not None:
            engine_start = mark if mark > receive_end else receive_end
            engine_start = until if engine_start > until else engine_start
            other = engine_start - receive_end
            mark = self.upstream_connected_ns
            if mark is not None:
                reached = mark if mark > engine_start else engine_start
                reached = until if reached > until else reached
                reach = reached - engine_start
                engine_start = reached
        return engine_start, other, reach

    def _engine_span_split(
        self, report: UpstreamReport, receive_end: int, last_chunk: int
    ) -> tuple[int, int, int, int, int]:
        """The engine's span said queue, prefill and decode: (queue, prefill, decode, other,
        reaching upstream). They are carved, in that order, out of the engine's part of the
        critical path (from reaching it to its last token event on the wire); what they leave
        of it is "other" (the engine's HTTP and tokenization, time no phase names), and a
        phase longer than what is left is cut to it, so the parts still sum to e2e."""
        engine_start, other, reach = self._proxy_segments(receive_end, last_chunk)
        rest = last_chunk - engine_start
        carved = []
        for seconds in (report.queue_s, report.prefill_s, report.decode_s):
            part = min(round((seconds or 0.0) * 1e9), rest)
            carved.append(part)
            rest -= part
        return carved[0], carved[1], carved[2], other + rest, reach

    def _before_first_byte(
        self, receive_end: int, first_byte: int
    ) -> tuple[int | None, int | None, int | None, int, int, int]:
        """Split the time from the end of the body to the first token's byte when no engine
        hooks marked it: (queue, prefill, queue_prefill, other, decode, reaching upstream).

        Behind a proxy the proxy's own time before it sends upstream is "other" and reaching
        the upstream is network. Of the rest, the phases the upstream reported are carved out
        (a non-streamed reply's decode too: its first byte comes after the last token); what
        no one reported is "queue_prefill" (the engine's queue and prefill, not split).
        """
        decode = 0
        if self.upstream_start_ns is None:  # not behind a proxy (most requests): no segments
            engine_start, other, reach = receive_end, 0, 0
        else:
            engine_start, other, reach = self._proxy_segments(receive_end, first_byte)
        rest = first_byte - engine_start
        report = self.upstream
        if report is None:
            return None, None, rest, other, 0, reach
        if report.decode_s is not None and not self.streamed:
            decode = min(round(report.decode_s * 1e9), rest)
            rest -= decode
        queue = prefill = None
        if report.queue_s is not None:
            queue = min(round(report.queue_s * 1e9), rest)
            rest -= queue
        if report.prefill_s is not None:
            prefill = min(round(report.prefill_s * 1e9), rest)
            rest -= prefill
        if queue is None and prefill is None:
            return None, None, rest, other, decode, reach
        if queue is None:
            queue = rest  # the engine said prefill only: what came before it is waiting
        elif prefill is None:
            prefill = rest
        else:
            other += rest  # both said: the remainder is neither (parsing, the engine's HTTP)
        return queue, prefill, None, other, decode, reach

    def _gaps(self, times: list[int], since: int | None) -> _Gaps:
        """(count, last, gaps in seconds) of the marks in `times` (those at or after `since`).

        Mark lists only grow by appending: the result is cached per (since, length, last mark),
        and the second breakdown of a response reuses it.
        """
        key = (since, len(times), times[-1] if times else None)
        cached = self._gaps_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        if since is not None and times and min(times) < since:
            times = [t for t in times if t >= since]
        gaps = hotpath.gaps_s(times)  # `(b - a) * NS` for each consecutive pair
        result = (len(times), times[-1] if times else None, gaps)
        self._gaps_cache = (key, result)
        return result

    def _preemption_gaps_ns(self) -> int:
        """Token-to-token gaps that contain a re-schedule (a preemption and its resume)."""
        if len(self.schedule_ns) < 2:
            return 0
        total = 0
        tokens = self.token_ns
        for resumed_at in self.schedule_ns[1:]:
            before = [t for t in tokens if t <= resumed_at]
            after = [t for t in tokens if t > resumed_at]
            if before and after:
                total += after[0] - before[-1]
        return total
