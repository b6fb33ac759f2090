"""The per-event hot path in pure Python: the reference the compiled `middleware._hotpath`
must agree with, and what runs where it is not built or `LLM_SLO_PURE_PYTHON=1`
(`middleware.hotpath` chooses). Each function here has a twin of the same name and behaviour
in `_hotpath.pyx`; `tests/unit/middleware/test_hotpath_agree.py` holds them to it.

- `token_events_in`, `decoded_has_text`: methods of `middleware.wire.reader.WireReader` (per chunk);
- `chunk_sent`: a method of `middleware.request.timeline.RequestTimeline` (per chunk);
- `gaps_s`: the inter-token gaps of a request's marks (per request, one per token);
- `bucket_counts`: the histogram bucket search (`middleware.metrics.histograms`);
- `window_add`: the live-window update (`middleware.live.windows.WindowSet.add`);
- `timings_comment`: the server's timings at a stream's end (`middleware.request.reporting`);
- `observe_values`: one request's values into their histogram series
  (`middleware.metrics.metric_set`);
- `count_in_columns`: one request's latencies into a live window's columns (`middleware.live`).
"""

from __future__ import annotations

import operator
from bisect import bisect_left, bisect_right
from collections.abc import Awaitable, Callable, Iterable, Sequence
from itertools import repeat
from typing import Any

import numpy as np

import middleware.wire.chunk as wire_chunk
from middleware.ring import NUM_SLOTS
from middleware.wire.chunk import NOT_DECODED, Chunk, carries_report

IMPLEMENTATION = "pure-python"
# The functions each implementation provides, with the same signatures and behaviour: the
# compiled twin exports the same list (`middleware.hotpath.HOT_FUNCTIONS`; a test holds both).
__all__ = (
    "bucket_counts",
    "chunk_sent",
    "count_in_columns",
    "decoded_has_text",
    "exchange_send",
    "gaps_s",
    "measured_offer",
    "observe_values",
    "timings_comment",
    "token_events_in",
    "window_add",
)
# Nanoseconds to seconds (the timeline's marks are nanoseconds).
NS = 1e-9

BucketCounts = list[tuple[int, int]]


def token_events_in(reader: Any, data: bytes) -> int:
    """How many token events one piece of a stream carried (the middleware's hot path:
    `feed` without the tuple, for a reader that does not rewrite the stream). A piece can
    hold several SSE events (an upstream that writes them together, TCP merging them):
    each is counted."""
    if reader._pending or not data.startswith(b"data: {") or data.find(b"\n\n") != len(data) - 2:
        return reader.feed(data)[0]
    if reader._head_pending:  # the first event only: one attribute read per chunk after it
        reader._read_head(memoryview(data)[6:-2])
    try:
        chunk = wire_chunk.decode_chunk(memoryview(data)[6:-2])
    except NOT_DECODED:
        return 0
    return 1 if reader._decoded_has_text(chunk) else 0


def decoded_has_text(reader: Any, chunk: Chunk) -> bool:
    """Whether a decoded chunk is a token event, counted. The usual delta (one choice with
    text; no usage, engine report, error or finish) is decided in a few attribute reads."""
    choices = chunk.choices
    if (
        choices is not None
        and len(choices) == 1
        and chunk.usage is None
        and chunk.error is None
        and not carries_report(chunk)
    ):
        choice = choices[0]
        delta = choice.delta
        text = choice.text if delta is None else delta.content
        if choice.finish_reason is None and text.__class__ is str and text:
            reader._events += 1
            reader._token_events += 1
            return True
    return reader._chunk(chunk)[0]


def exchange_send(exchange: Any, message: Any) -> Awaitable[None]:
    """`Exchange.send`: a stream's middle chunk, once per token, is marked here (the timeline's
    marks, from the wire's token events); every other message goes to
    `exchange._send_message`. With a token event the server's own `send` is handed back to be
    awaited, else `exchange._sent_quiet_chunk` (the chunk may have held `[DONE]`)."""
    hot = exchange._hot
    if hot is not None and message.__class__ is dict:
        body = message.get("body")
        if body and message.get("type") == "http.response.body" and message.get("more_body"):
            wire, timeline, _, _, send, now_ns = hot
            started = now_ns()
            carried = token_events_in(wire, body)
            chunk_sent(timeline, started, carried)
            if carried:
                return send(message)  # type: ignore[no-any-return]
            return exchange._sent_quiet_chunk(message)  # type: ignore[no-any-return]
    return exchange._send_message(message)  # type: ignore[no-any-return]


def measured_offer(exchange: Any, below_offer: Callable[[bytes], bool]) -> Callable[[bytes], bool]:
    """The measured request's direct write of a stream's middle piece
    (`middleware.request.exchange_direct`): while the answer is an SSE stream and the server below
    takes the piece (`below_offer` wrote it: True), the piece is marked and read as
    `Exchange.send` marks and reads a middle chunk, the clock read before the write. False:
    nothing was written or marked, and the piece goes through `send`."""
    timeline, wire, now_ns = exchange.timeline, exchange.wire, exchange.now_ns

    def offer(body: bytes) -> bool:
        if not exchange.is_stream:
            return False
        started = now_ns()
        if not below_offer(body):
            return False
        carried = token_events_in(wire, body)
        chunk_sent(timeline, started, carried)
        if not carried:
            exchange.quiet_piece_sent()
        return True

    return offer


def chunk_sent(timeline: Any, started_ns: int, token_events: int = 1) -> None:
    """A body chunk with bytes was handed to `send` at `started_ns`, holding
    `token_events` token events (text), as the wire parser read it. Events sent in one
    chunk arrived together: each is a mark, with gaps of 0 between them."""
    timeline.body_chunk_ns.append(started_ns)
    if token_events:
        marks = timeline.token_chunk_ns
        # Whatever appends token marks sets the first token's byte (here, `count_every_chunk`):
        # it is set by the first mark, and read only while there is none (as compiled).
        if not marks and timeline.first_token_byte_ns is None:
            timeline.first_token_byte_ns = started_ns
        marks.extend([started_ns] * token_events)


def gaps_s(times: list[int]) -> tuple[float, ...]:
    """`(b - a) * NS` for each consecutive pair of marks, in seconds (looped in C)."""
    return tuple(map(operator.mul, map(operator.sub, times[1:], times[:-1]), repeat(NS)))


def bucket_counts(bounds: Sequence[float], values: Iterable[float]) -> BucketCounts:
    """`(index, count)` for every bucket the values fall in, index as Prometheus places a value:
    `bisect_left(bounds, value)` (upper bounds inclusive; `len(bounds)` is +Inf).

    Values in few buckets are counted with a sort (in C) and a few bisects per touched bucket
    instead of one bisect per value.
    """
    ordered = sorted(values)
    size = len(ordered)
    last = len(bounds)
    counts: BucketCounts = []
    position = 0
    while position < size:
        index = bisect_left(bounds, ordered[position])
        end = size if index == last else bisect_right(ordered, bounds[index], position)
        end = max(end, position + 1)  # always progress, whatever the values compare like
        counts.append((index, end - position))
        position = end
    return counts


def window_add(
    counts: np.ndarray,
    slot_ids: np.ndarray,
    slot_s: np.ndarray,
    now_s: float,
    columns: np.ndarray,
    amounts: np.ndarray,
) -> None:
    """Add `amounts` to `columns` (unique) in the current slot of every window's ring:
    `counts` (rings x NUM_SLOTS x width) and `slot_ids` (rings x NUM_SLOTS, the slot each
    row holds) of `middleware.live.windows.WindowSet`, `slot_s` the rings' slot lengths."""
    slot_now = np.floor(now_s / slot_s).astype(np.int64)
    rows = slot_now % NUM_SLOTS
    rings = np.arange(len(slot_s))
    stale = slot_ids[rings, rows] != slot_now
    if stale.any():  # the slot is reused: forget what it held a full ring ago
        counts[rings[stale], rows[stale]] = 0.0
        slot_ids[rings[stale], rows[stale]] = slot_now[stale]
    counts[rings[:, None], rows[:, None], columns[None, :]] += amounts


# The timings comment's template per tuple of phase fields (made once: `timings_comment`).
_COMMENT_TEMPLATES: dict[tuple[str, ...], bytes] = {}


def timings_comment(breakdown: Any, names: tuple[str, ...], seconds: Sequence[float]) -> bytes:
    """The final SSE comment (`: llm-slo-timings {...}`): the phases' `seconds` under their
    JSON keys `names` (in the same order), the breakdown's e2e and, when known, TTFT, all in
    seconds to the microsecond ("%.6f": correctly rounded), then its output_tokens. Compact
    JSON, %-formatted in one step from a template made once."""
    template = _COMMENT_TEMPLATES.get(names)
    if template is None:
        template = _COMMENT_TEMPLATES[names] = (
            b": llm-slo-timings {"
            + b",".join(b'"%s":%%.6f' % name.encode() for name in names)
            + b',"e2e_s":%.6f%s,"output_tokens":%d}\n\n'
        )
    ttft = breakdown.ttft_s
    return template % (
        *seconds,
        breakdown.e2e_s,
        b"" if ttft is None else b',"ttft_s":%.6f' % ttft,
        breakdown.output_tokens,
    )


def observe_values(plan: Sequence[Any], values: Sequence[Any], trace_id: str | None) -> None:
    """Each value (None: not observed) into its `HistogramSeries` of `plan` (`(series,
    takes_exemplar)` pairs, in the values' order): its bucket (`bisect_left` on the series'
    bounds) and its sum; with `trace_id`, a series that takes exemplars keeps it."""
    for value, (series, takes_exemplar) in zip(values, plan, strict=True):
        if value is None:
            continue
        if takes_exemplar and trace_id:
            series.observe(value, trace_id)
        else:
            series.counts[bisect_left(series.bounds, value)] += 1
            series.sum += value


def count_in_columns(pending: list[float], columns: Sequence[Any], breakdown: Any) -> None:
    """One request's latencies into a live window's pending counts: for each `(field, start,
    bounds)` of `columns`, the Breakdown's `field` (None: not counted) adds 1 to the column
    `start + bisect_left(bounds, value)`."""
    for field, start, bounds in columns:
        value = getattr(breakdown, field)
        if value is not None:
            pending[start + bisect_left(bounds, value)] += 1
