"""One request's timeline: marks from the HTTP side and the engine, and the breakdown derived once.

The breakdown cuts the request's critical path into consecutive segments, so the parts add up
to e2e exactly and none is negative, even though sending overlaps decoding in a stream:

    start .. receive_end ........ enqueue ....... schedule ..... first token ..... last token ..... last byte
    | network (in) |    other     |    queue      |   prefill    | decode (+detok)  | network (out) |

- detokenize is the sum of per-token detokenization time, carved out of decode;
- a preemption after the first token (the gap from the token before it to the token after
  the re-schedule) moves from decode to queue: preemption adds queue time, not prefill time;
- with no engine reporting phases, start..first token byte is one "other" (server) segment and
  queue/prefill stay unknown (None).

TTFT = first byte of the first token's chunk handed to `send` - start; e2e = end of the last
`send` - start; TPOT = (e2e - TTFT) / (output_tokens - 1); ITL = every gap between consecutive
tokens.
"""

from __future__ import annotations

import contextvars
import itertools
from dataclasses import dataclass, field

from middleware.clock import Clock

NS = 1e-9

ENGINE_EVENTS = (
    "enqueue",
    "schedule",
    "prefill_start",
    "prefill_end",
    "token",
    "detokenize",
    "finish",
)


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Everything derived from a finished timeline, in seconds."""

    e2e_s: float
    ttft_s: float | None
    tpot_s: float | None
    itl_s: tuple[float, ...]
    network_s: float
    queue_s: float | None
    prefill_s: float | None
    decode_s: float
    detokenize_s: float
    other_s: float
    output_tokens: int

    @property
    def phases(self) -> dict[str, float]:
        """The additive parts (unknown ones as 0): they sum to e2e."""
        return {
            "network": self.network_s,
            "queue": self.queue_s or 0.0,
            "prefill": self.prefill_s or 0.0,
            "decode": self.decode_s,
            "detokenize": self.detokenize_s,
            "other": self.other_s,
        }


@dataclass(slots=True, eq=False)
class RequestTimeline:
    """Marks of one request, in the clock's nanoseconds. Made per request, never shared."""

    request_id: str
    clock: Clock
    start_ns: int = 0
    wall_start_s: float = 0.0
    receive_end_ns: int | None = None
    enqueue_ns: int | None = None
    schedule_ns: list[int] = field(default_factory=list)
    prefill_start_ns: int | None = None
    prefill_end_ns: int | None = None
    token_ns: list[int] = field(default_factory=list)
    detokenize_ns: int = 0
    first_token_byte_ns: int | None = None
    last_byte_ns: int | None = None
    body_chunk_ns: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    input_tokens: int = 0
    cached_tokens: int = 0
    engine_reported: bool = False

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
        self.engine_reported = True
        if event == "token":
            self.token_ns.append(at)
        elif event == "detokenize":
            self.detokenize_ns += duration_ns
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
                f"unknown timeline event {event!r}; use one of {', '.join(ENGINE_EVENTS)}"
            )

    # Called by the middleware around the app's receive/send.
    def body_received(self, at_ns: int) -> None:
        self.receive_end_ns = at_ns

    def chunk_sent(self, started_ns: int) -> None:
        """A body chunk with bytes was handed to `send` at `started_ns`."""
        self.body_chunk_ns.append(started_ns)
        # With an engine bridge only a chunk sent after the first token carries it (an SSE
        # role-only chunk before it does not); without one, the first chunk is all we know.
        carries_token = not self.engine_reported or (
            self.token_ns and self.token_ns[0] <= started_ns
        )
        if carries_token and self.first_token_byte_ns is None:
            self.first_token_byte_ns = started_ns

    def body_sent(self, started_ns: int, ended_ns: int, has_bytes: bool) -> None:
        """A body message handed to `send` from `started_ns` to `ended_ns`."""
        if has_bytes:
            self.chunk_sent(started_ns)
        self.last_byte_ns = ended_ns

    def breakdown(self) -> Breakdown:
        start = self.start_ns
        end = max(self.last_byte_ns or self.clock.now_ns(), start)
        receive_end = _clamp(self.receive_end_ns, start, end, default=start)
        tokens = self.token_ns
        if self.engine_reported and tokens:
            enqueue = _clamp(self.enqueue_ns, receive_end, end, default=receive_end)
            schedule = _clamp(
                self.schedule_ns[0] if self.schedule_ns else None, enqueue, end, default=enqueue
            )
            first_token = _clamp(tokens[0], schedule, end, default=schedule)
            last_token = _clamp(tokens[-1], first_token, end, default=first_token)
            resumed_gaps = self._preemption_gaps_ns()
            decode_total = last_token - first_token
            preempted = min(resumed_gaps, decode_total)
            detokenize = min(self.detokenize_ns, decode_total - preempted)
            network_ns = (receive_end - start) + (end - last_token)
            queue_ns: int | None = schedule - enqueue + preempted
            prefill_ns: int | None = first_token - schedule
            decode_ns = decode_total - preempted - detokenize
            other_ns = enqueue - receive_end
            itl = tuple((b - a) * NS for a, b in itertools.pairwise(tokens))
            output_tokens = len(tokens)
        else:
            # No engine phases: the server's time up to the first byte is one segment.
            first_byte = _clamp(self.first_token_byte_ns, receive_end, end, default=end)
            chunks = [t for t in self.body_chunk_ns if t >= first_byte]
            last_chunk = _clamp(chunks[-1] if chunks else None, first_byte, end, default=first_byte)
            network_ns = (receive_end - start) + (end - last_chunk)
            queue_ns = prefill_ns = None
            decode_ns = last_chunk - first_byte
            detokenize = 0
            other_ns = first_byte - receive_end
            itl = tuple((b - a) * NS for a, b in itertools.pairwise(chunks))
            output_tokens = len(chunks)
        e2e = end - start
        ttft = (
            None
            if self.first_token_byte_ns is None
            else max(self.first_token_byte_ns - start, 0) * NS
        )
        if ttft is None and output_tokens and self.last_byte_ns is not None:
            ttft = e2e * NS  # a non-streamed answer: the first token arrives with the last byte
        tpot = None
        if ttft is not None and output_tokens > 1:
            tpot = max(e2e * NS - ttft, 0.0) / (output_tokens - 1)
        return Breakdown(
            e2e_s=e2e * NS,
            ttft_s=ttft,
            tpot_s=tpot,
            itl_s=itl,
            network_s=network_ns * NS,
            queue_s=None if queue_ns is None else queue_ns * NS,
            prefill_s=None if prefill_ns is None else prefill_ns * NS,
            decode_s=decode_ns * NS,
            detokenize_s=detokenize * NS,
            other_s=other_ns * NS,
            output_tokens=output_tokens,
        )

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


def _clamp(value: int | None, low: int, high: int, default: int) -> int:
    if value is None:
        return default
    return min(max(value, low), high)


_current: contextvars.ContextVar[RequestTimeline | None] = contextvars.ContextVar(
    "llm_slo_timeline", default=None
)


def current_timeline() -> RequestTimeline | None:
    """The timeline of the request being handled here, for engines that report phases themselves:

    timeline = current_timeline()
    if timeline is not None:
        timeline.mark("prefill_start")
    """
    return _current.get()


def set_current_timeline(
    timeline: RequestTimeline | None,
) -> contextvars.Token[RequestTimeline | None]:
    return _current.set(timeline)


def reset_current_timeline(token: contextvars.Token[RequestTimeline | None]) -> None:
    _current.reset(token)
