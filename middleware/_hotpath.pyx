# cython: language_level=3, binding=True, boundscheck=False, wraparound=False, cdivision=False
"""The per-event hot path, compiled (Cython): the twin of `middleware._hotpath_py`, function for
function, with the same behaviour (`tests/unit/middleware/test_hotpath_agree.py` holds them to it).

What is typed here is what the interpreter paid for per event: the byte checks of a whole
`data: {...}` event (C compares instead of method calls), the attribute reads that decide a
usual delta, the timeline's mark appends, the gaps between marks, the bucket search over C
doubles and the live-window update over typed views (no numpy temporaries). The JSON itself
is still decoded by msgspec (C). Anything outside what a typed path takes (a piece that is not
`bytes`, marks that are not machine integers, arrays of another dtype) goes to the pure-Python
twin, so no input behaves differently.
"""

from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_CheckExact
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.math cimport floor, signbit
from libc.stdint cimport int64_t
from libc.string cimport memchr, memcmp, memcpy, strlen

import bisect as _bisect

from middleware import _hotpath_py as _py
from middleware.ring import NUM_SLOTS as _NUM_SLOTS
import middleware.wire.chunk as wire_chunk
from middleware.wire.chunk import NOT_DECODED, carries_report

IMPLEMENTATION = "compiled"
# The twin's functions, by name: both implementations export exactly these.
__all__ = _py.__all__
cdef double NS = 1e-9
cdef Py_ssize_t NUM_SLOTS = _NUM_SLOTS
# Ints up to 2**53 are exact as doubles.
cdef object _EXACT_INT = 2 ** 53


include "_delta_scan.pxi"


cdef inline bint _one_whole_event(bytes data):
    """`data.startswith(b"data: {") and data.find(b"\\n\\n") == len(data) - 2`, in C."""
    cdef Py_ssize_t size = len(data)
    cdef const char* start = PyBytes_AS_STRING(data)
    cdef const char* at
    cdef const char* stop
    if size < 9 or memcmp(start, b"data: {", 7) != 0:
        return False
    if start[size - 2] != b"\n" or start[size - 1] != b"\n":
        return False
    # No blank line before the final one: no "\n\n" starting before size - 2.
    at = start
    stop = start + size - 2
    while at < stop:
        at = <const char*>memchr(at, b"\n", stop - at)
        if at == NULL:
            return True
        if at[1] == b"\n":
            return False
        at += 1
    return True


cdef class _UsualEvent:
    """A stream's usual token event, as the compiled scan keeps it on its reader
    (`WireReader._usual`): its bytes up to its text's opening quote (`head`) and from the
    closing one (`tail`), and how many usual token events the stream has carried (`count`:
    `WireReader.events` and `token_events` add it). Counted here, a usual event costs no
    attribute write on the reader."""

    cdef bytes head
    cdef bytes tail
    cdef readonly Py_ssize_t count

    def __init__(self):
        raise TypeError("_UsualEvent is made by the compiled scan only (`_token_events_in`)")


def token_events_in(reader, data):
    """How many token events one piece of a stream carried (`_hotpath_py.token_events_in`)."""
    return _token_events_in(reader, data)


cdef object _token_events_in(object reader, object data):
    if not PyBytes_CheckExact(data):
        return _py.token_events_in(reader, data)
    if reader._pending:
        return reader.feed(data)[0]
    cdef Py_ssize_t size = len(<bytes>data)
    cdef const unsigned char* start = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef _Span span
    cdef _UsualEvent fresh
    if size == 14 and memcmp(start, b"data: [DONE]\n\n", 14) == 0:
        # The stream's end, alone in its piece (what `feed` reads from it: done, no event).
        reader.done = True
        return 0
    usual = reader._usual
    if usual is not None and _same_shape(
        start, size, (<_UsualEvent?>usual).head, (<_UsualEvent>usual).tail
    ):
        # The stream's usual token event again, other text: no scan of the rest.
        (<_UsualEvent>usual).count += 1
        return 1
    if not _one_whole_event(<bytes>data):
        return reader.feed(data)[0]
    if not reader._head_pending and _usual_delta(start + 6, size - 8, &span) == 1:
        # What `decoded_has_text` does for the usual delta, without decoding it; its bytes
        # around the text are kept, for the next events of the stream (`_same_shape`).
        fresh = _UsualEvent.__new__(_UsualEvent)
        fresh.head = PyBytes_FromStringAndSize(<const char*>start, span.opening + 1 - start)
        fresh.tail = PyBytes_FromStringAndSize(
            <const char*>span.closing, start + size - span.closing
        )
        fresh.count = 1 if usual is None else (<_UsualEvent?>usual).count + 1
        reader._usual = fresh
        return 1
    payload = PyBytes_FromStringAndSize(<const char*>start + 6, size - 8)
    if reader._head_pending:  # the first event only
        reader._read_head(payload)
    try:
        chunk = wire_chunk.decode_chunk(payload)
    except NOT_DECODED:
        return 0
    return 1 if _decoded_has_text(reader, chunk) else 0


def decoded_has_text(reader, chunk):
    """Whether a decoded chunk is a token event, counted (`_hotpath_py.decoded_has_text`)."""
    return _decoded_has_text(reader, chunk)


cdef bint _quiet_delta(object delta) except -1:
    """A delta (or message) with no text of any kind: content None or "", no reasoning, no
    tool calls (what `_delta_has_text` says is not a token event, in the shapes it takes)."""
    if delta is None:
        return True
    content = delta.content
    return (
        (content is None or (type(content) is str and len(<str>content) == 0))
        and delta.reasoning_content is None
        and delta.reasoning is None
        and delta.tool_calls is None
    )


cdef bint _decoded_has_text(object reader, object chunk) except -1:
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
        finish = choice.finish_reason
        if finish is None and type(text) is str and len(<str>text) != 0:
            reader._events += 1
            reader._token_events += 1
            return True
        # A single choice with no text at all (the role chunk that opens a stream, the
        # finish chunk that ends it): what `WireReader._chunk` does for it, without the calls.
        plain = choice.text
        if (plain is None or (type(plain) is str and len(<str>plain) == 0)) and _quiet_delta(
            delta if delta is not None else choice.message
        ):
            if finish is None:
                reader._events += 1
                return False
            if type(finish) is str and len(<str>finish) != 0:
                reader._events += 1
                reader.finished = True
                reader.finish_reasons.append(finish)
                return False
    return reader._chunk(chunk)[0]


def exchange_send(exchange, message):
    """`Exchange.send` (`_hotpath_py.exchange_send`): a stream's middle chunk, once per token,
    is marked here, in C; every other message goes to `exchange._send_message`."""
    hot = exchange._hot
    if hot is None or type(message) is not dict:
        return exchange._send_message(message)
    body = (<dict>message).get("body")
    if (
        not body
        or (<dict>message).get("type") != "http.response.body"
        or not (<dict>message).get("more_body", False)
    ):
        return exchange._send_message(message)
    cdef tuple parts = hot
    cdef list body_marks = parts[2]
    cdef list token_marks = parts[3]
    started = parts[5]()
    carried = _token_events_in(parts[0], body)
    body_marks.append(started)
    if carried:
        _token_marks_sent(parts[1], token_marks, started, carried)
        return parts[4](message)
    return exchange._sent_quiet_chunk(message)


cdef class _MeasuredOffer:
    """`_hotpath_py.measured_offer`'s offer, in one C call per piece."""

    cdef object exchange, wire, timeline, now_ns, below_offer
    cdef list body_marks, token_marks

    def __cinit__(self):
        self.exchange = None

    def __call__(self, body):
        exchange = self.exchange
        if exchange is None:
            raise TypeError("_MeasuredOffer is made by measured_offer only")
        if not exchange.is_stream:
            return False
        started = self.now_ns()
        if not self.below_offer(body):
            return False
        carried = _token_events_in(self.wire, body)
        self.body_marks.append(started)
        if carried:
            _token_marks_sent(self.timeline, self.token_marks, started, carried)
        else:
            exchange.quiet_piece_sent()
        return True


def measured_offer(exchange, below_offer):
    """`_hotpath_py.measured_offer`: the piece's checks, marks and scan in C (the timeline's
    mark lists, held for the request: they are only ever changed in place)."""
    timeline = exchange.timeline
    body_marks, token_marks = timeline.body_chunk_ns, timeline.token_chunk_ns
    if type(body_marks) is not list or type(token_marks) is not list:
        return _py.measured_offer(exchange, below_offer)
    cdef _MeasuredOffer offer = _MeasuredOffer()
    offer.exchange = exchange
    offer.wire = exchange.wire
    offer.timeline = timeline
    offer.now_ns = exchange.now_ns
    offer.below_offer = below_offer
    offer.body_marks = body_marks
    offer.token_marks = token_marks
    return offer


def chunk_sent(timeline, started_ns, token_events=1):
    """A body chunk handed to `send` at `started_ns` with `token_events` token events
    (`_hotpath_py.chunk_sent`)."""
    _chunk_sent(timeline, started_ns, token_events)


cdef object _chunk_sent(object timeline, object started_ns, object token_events):
    timeline.body_chunk_ns.append(started_ns)
    if token_events:
        _token_marks_sent(timeline, timeline.token_chunk_ns, started_ns, token_events)


cdef inline object _token_marks_sent(
    object timeline, list marks, object started_ns, object token_events
):
    """`token_events` marks at `started_ns` on `marks` (the timeline's `token_chunk_ns`), the
    first token's byte set by the first. Whatever appends token marks sets that byte (here,
    `count_every_chunk`), so with marks already there it is set: read only while none are."""
    if len(marks) == 0 and timeline.first_token_byte_ns is None:
        timeline.first_token_byte_ns = started_ns
    if token_events == 1:
        marks.append(started_ns)
    else:
        marks.extend([started_ns] * token_events)


include "_counts.pxi"
include "_timings.pxi"
