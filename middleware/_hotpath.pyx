# cython: language_level=3, binding=True, boundscheck=False, wraparound=False, cdivision=False
"""The per-event hot path, compiled (Cython): the twin of `middleware._hotpath_py`, function for
function, with the same behaviour (`tests/unit/test_hotpath_agree.py` holds them to it).

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
from middleware.wire_chunk import NOT_DECODED, decode_chunk

IMPLEMENTATION = "compiled"
cdef double NS = 1e-9
cdef Py_ssize_t NUM_SLOTS = _py.NUM_SLOTS
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


cdef class UsualEvent:
    """A stream's usual token event, as the compiled scan keeps it on its reader
    (`WireReader._usual`): its bytes up to its text's opening quote (`head`) and from the
    closing one (`tail`), and how many usual token events the stream has carried (`count`:
    `WireReader.events` and `token_events` add it). Counted here, a usual event costs no
    attribute write on the reader."""

    cdef bytes head
    cdef bytes tail
    cdef readonly Py_ssize_t count

    def __init__(self):
        raise TypeError("UsualEvent is made by the compiled scan only (`_token_events_in`)")


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
    cdef UsualEvent fresh
    if size == 14 and memcmp(start, b"data: [DONE]\n\n", 14) == 0:
        # The stream's end, alone in its piece (what `feed` reads from it: done, no event).
        reader.done = True
        return 0
    usual = reader._usual
    if usual is not None and _same_shape(
        start, size, (<UsualEvent?>usual).head, (<UsualEvent>usual).tail
    ):
        # The stream's usual token event again, other text: no scan of the rest.
        (<UsualEvent>usual).count += 1
        return 1
    if not _one_whole_event(<bytes>data):
        return reader.feed(data)[0]
    if not reader._head_pending and _usual_delta(start + 6, size - 8, &span) == 1:
        # What `decoded_has_text` does for the usual delta, without decoding it; its bytes
        # around the text are kept, for the next events of the stream (`_same_shape`).
        fresh = UsualEvent.__new__(UsualEvent)
        fresh.head = PyBytes_FromStringAndSize(<const char*>start, span.opening + 1 - start)
        fresh.tail = PyBytes_FromStringAndSize(
            <const char*>span.closing, start + size - span.closing
        )
        fresh.count = 1 if usual is None else (<UsualEvent?>usual).count + 1
        reader._usual = fresh
        return 1
    payload = PyBytes_FromStringAndSize(<const char*>start + 6, size - 8)
    if reader._head_pending:  # the first event only
        reader._read_head(payload)
    try:
        chunk = decode_chunk(payload)
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
        and chunk.timings is None
        and chunk.error is None
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


cdef class MeasuredOffer:
    """`_hotpath_py.measured_offer`'s offer, in one C call per piece."""

    cdef object exchange, wire, timeline, now_ns, below_offer
    cdef list body_marks, token_marks

    def __cinit__(self):
        self.exchange = None

    def __call__(self, body):
        exchange = self.exchange
        if exchange is None:
            raise TypeError("MeasuredOffer is made by measured_offer only")
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
    cdef MeasuredOffer offer = MeasuredOffer()
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


def gaps_s(times):
    """`(b - a) * NS` for each consecutive pair of marks, in seconds (`_hotpath_py.gaps_s`)."""
    if type(times) is not list:
        return _py.gaps_s(times)
    cdef list marks = <list>times
    cdef Py_ssize_t size = len(marks)
    cdef Py_ssize_t index
    cdef long long before, after
    if size < 2:
        return ()
    cdef list gaps = []
    # Marks within +-2**62 have differences a long long holds; past that (no clock's, but a
    # caller's) the subtraction would overflow, so Python's integers take them.
    cdef long long limit = 1LL << 62
    try:
        before = marks[0]
        if before >= limit or before <= -limit:
            return _py.gaps_s(times)
        for index in range(1, size):
            after = marks[index]
            if after >= limit or after <= -limit:
                return _py.gaps_s(times)
            gaps.append((<double>(after - before)) * NS)
            before = after
    except (TypeError, OverflowError):  # marks that are not machine integers
        return _py.gaps_s(times)
    return tuple(gaps)


cdef inline Py_ssize_t _bisect_left(const double* items, Py_ssize_t low, Py_ssize_t high,
                                    double value) noexcept:
    cdef Py_ssize_t middle
    while low < high:
        middle = (low + high) >> 1
        if items[middle] < value:
            low = middle + 1
        else:
            high = middle
    return low


cdef bint _exact(object item, double* out):
    """`item` as a C double where it compares as one: a float, or an int a double holds
    exactly (Python compares ints exactly; C doubles would not past 2**53)."""
    if PyFloat_CheckExact(item):
        out[0] = PyFloat_AS_DOUBLE(item)
        return True
    if type(item) is int and -_EXACT_INT <= item <= _EXACT_INT:
        out[0] = <double>(<long long>item)
        return True
    return False


cdef enum:
    _MOST_BOUNDS = 128  # bucket bounds kept on the stack; more go to the pure-Python twin


def bucket_counts(bounds, values):
    """`(index, count)` per touched bucket, `bisect_left(bounds, value)` placing a value
    (`_hotpath_py.bucket_counts`): the same sort and the same bisects, over C doubles."""
    cdef list ordered = sorted(values)
    cdef Py_ssize_t size = len(ordered), last
    cdef Py_ssize_t position = 0, index, end, low, high, middle
    cdef double limits[_MOST_BOUNDS]
    cdef double value, limit
    last = _limits_of(bounds, limits)  # the bounds' one length, the one searched
    if last < 0:
        return _py.bucket_counts(bounds, ordered)
    for index in range(size):
        if not PyFloat_CheckExact(<object>PyList_GET_ITEM(ordered, index)):
            return _py.bucket_counts(bounds, ordered)
    counts = []
    while position < size:
        value = PyFloat_AS_DOUBLE(<object>PyList_GET_ITEM(ordered, position))
        index = _bisect_left(limits, 0, last, value)
        end = size
        if index != last:  # bisect_right(ordered, bounds[index], position)
            limit, low, high = limits[index], position, size
            while low < high:
                middle = (low + high) >> 1
                if limit < PyFloat_AS_DOUBLE(<object>PyList_GET_ITEM(ordered, middle)):
                    high = middle
                else:
                    low = middle + 1
            end = low
        if end < position + 1:  # always progress, whatever the values compare like
            end = position + 1
        counts.append((index, end - position))
        position = end
    return counts


cdef int _window_add(double[:, :, ::1] counts, long long[:, ::1] slot_ids,
                     const double[::1] slot_s, double now_s, const long long[::1] columns,
                     const double[::1] amounts) noexcept nogil:
    """0 when added; -1, before touching anything, where numpy would index otherwise
    (negative or out-of-range columns, shapes that do not match): the caller falls back."""
    cdef Py_ssize_t ring, row, column, width = counts.shape[2]
    cdef long long slot_now
    if (columns.shape[0] != amounts.shape[0] or slot_ids.shape[0] != slot_s.shape[0]
            or counts.shape[0] != slot_s.shape[0] or counts.shape[1] != NUM_SLOTS
            or slot_ids.shape[1] != NUM_SLOTS):
        return -1
    for column in range(columns.shape[0]):
        if columns[column] < 0 or columns[column] >= width:
            return -1
    for ring in range(slot_s.shape[0]):
        slot_now = <long long>floor(now_s / slot_s[ring])
        row = slot_now % NUM_SLOTS
        if row < 0:
            row += NUM_SLOTS
        if slot_ids[ring, row] != slot_now:  # the slot is reused: forget what it held
            for column in range(width):
                counts[ring, row, column] = 0.0
            slot_ids[ring, row] = slot_now
        for column in range(columns.shape[0]):
            counts[ring, row, columns[column]] += amounts[column]
    return 0


def window_add(counts, slot_ids, slot_s, double now_s, columns, amounts):
    """Add `amounts` to `columns` in the current slot of every ring
    (`_hotpath_py.window_add`): typed loops, no numpy temporaries."""
    try:
        added = _window_add(counts, slot_ids, slot_s, now_s, columns, amounts)
    except (ValueError, TypeError, BufferError):  # another dtype or layout
        added = -1
    if added != 0:  # numpy's own rules (and errors) for anything else
        _py.window_add(counts, slot_ids, slot_s, now_s, columns, amounts)


# The timings comment is written into a buffer of this size; longer field names go to the twin.
DEF _COMMENT_SIZE = 2048
# Below 2**40 a double's ulp is at most 2**-12: a product x * 1e6 whose fraction is further
# than 2**-11 from one half rounds to the same integer as the exact decimal value would.
cdef double _EXACT_BELOW = 1099511627776.0
cdef double _TIE_MARGIN = 0.00048828125


cdef Py_ssize_t _put(char* out, Py_ssize_t at, const char* text, Py_ssize_t size) noexcept:
    memcpy(out + at, text, size)
    return at + size


cdef Py_ssize_t _put_micro(char* out, Py_ssize_t at, int64_t micro) noexcept:
    """`micro` millionths as "%d.%06d" (micro >= 0)."""
    cdef char digits[24]
    cdef int64_t whole = micro // 1000000
    cdef int64_t fraction = micro % 1000000
    cdef int size = 0, index
    while True:
        digits[size] = <char>(48 + whole % 10)
        size += 1
        whole //= 10
        if whole == 0:
            break
    for index in range(size):
        out[at + index] = digits[size - 1 - index]
    at += size
    out[at] = b"."
    for index in range(6, 0, -1):
        out[at + index] = <char>(48 + fraction % 10)
        fraction //= 10
    return at + 7


cdef Py_ssize_t _put_seconds(char* out, Py_ssize_t at, object value) except -1:
    """`value` as "%.6f" does it (correctly rounded to 6 places): in C where the rounding is
    certain, else by Python's own formatting."""
    cdef double x, scaled, whole, fraction
    cdef bytes text
    if PyFloat_CheckExact(value):
        x = PyFloat_AS_DOUBLE(value)
        scaled = x * 1e6
        if x == 0.0 and not signbit(x):
            return _put_micro(out, at, 0)
        if x > 0.0 and scaled < _EXACT_BELOW:
            whole = floor(scaled)
            fraction = scaled - whole
            if fraction < 0.5 - _TIE_MARGIN:
                return _put_micro(out, at, <int64_t>whole)
            if fraction > 0.5 + _TIE_MARGIN:
                return _put_micro(out, at, <int64_t>whole + 1)
    text = b"%.6f" % (value,)
    if len(text) > 64:
        return -2  # a huge number: the whole comment is written by the twin
    return _put(out, at, PyBytes_AS_STRING(text), len(text))


def timings_comment(breakdown, names, seconds):
    """The final SSE comment (`_hotpath_py.timings_comment`), written in C."""
    cdef char out[_COMMENT_SIZE]
    cdef Py_ssize_t at = 0, size, room = 0, index = 0
    cdef const char* key
    if type(names) is not tuple or type(seconds) is not tuple or len(names) != len(seconds):
        return _py.timings_comment(breakdown, names, seconds)
    for name in <tuple>names:
        if type(name) is not str:
            return _py.timings_comment(breakdown, names, seconds)
        PyUnicode_AsUTF8AndSize(name, &size)  # bytes, not characters, go in the buffer
        room += size + 80  # the quotes, the colon, the comma and a number of at most 64
    tokens = b',"output_tokens":%d}\n\n' % (breakdown.output_tokens,)
    if room + len(tokens) + 200 > _COMMENT_SIZE:  # the head, e2e and TTFT: under 200
        return _py.timings_comment(breakdown, names, seconds)
    at = _put(out, at, b": llm-slo-timings {", 19)
    for name in <tuple>names:
        key = PyUnicode_AsUTF8AndSize(name, &size)
        if at > 19:
            out[at] = b","
            at += 1
        out[at] = b'"'
        at = _put(out, at + 1, key, size)
        at = _put(out, at, b'":', 2)
        at = _put_seconds(out, at, <object>PyTuple_GET_ITEM(seconds, index))
        index += 1
        if at < 0:
            return _py.timings_comment(breakdown, names, seconds)
    at = _put(out, at, b',"e2e_s":', 9)
    at = _put_seconds(out, at, breakdown.e2e_s)
    ttft = breakdown.ttft_s
    if ttft is not None and at >= 0:
        at = _put(out, at, b',"ttft_s":', 10)
        at = _put_seconds(out, at, ttft)
    if at < 0:
        return _py.timings_comment(breakdown, names, seconds)
    at = _put(out, at, PyBytes_AS_STRING(tokens), len(tokens))
    return PyBytes_FromStringAndSize(out, at)


cdef Py_ssize_t _limits_of(object bounds, double* limits) except -2:
    """The bounds as C doubles in `limits` (room for _MOST_BOUNDS); how many, or -1 where they
    are more, or a C compare with one might not be Python's (not `_exact`)."""
    cdef Py_ssize_t size = len(bounds), index
    if size > _MOST_BOUNDS:
        return -1
    for index in range(size):
        if not _exact(bounds[index], &limits[index]):
            return -1
    return size


cdef Py_ssize_t _bucket_of(object bounds, object value) except -2:
    """`bisect_left(bounds, value)` over C doubles, for a tuple or list of bounds; -1 where a C
    compare might not be Python's (an item or the value not `_exact`): the caller bisects.
    It walks the bounds in place, as `_bisect_left` walks a C array: converting them first
    (`_limits_of`) costs every bound per value, about 14k instructions of a request's report
    where the walk reads only log2 of them."""
    cdef double x, limit
    cdef Py_ssize_t low = 0, high, middle
    cdef bint is_tuple = type(bounds) is tuple
    if not is_tuple and type(bounds) is not list:
        return -1
    if not _exact(value, &x):
        return -1
    high = PyTuple_GET_SIZE(bounds) if is_tuple else PyList_GET_SIZE(bounds)
    while low < high:
        middle = (low + high) >> 1
        item = <object>(PyTuple_GET_ITEM(bounds, middle) if is_tuple else PyList_GET_ITEM(bounds, middle))
        if not _exact(item, &limit):
            return -1
        if limit < x:
            low = middle + 1
        else:
            high = middle
    return low


def observe_values(plan, values, trace_id):
    """`_hotpath_py.observe_values`: the bucket search over C doubles."""
    cdef Py_ssize_t index
    if len(plan) != len(values):  # what zip(strict=True) says
        return _py.observe_values(plan, values, trace_id)
    for value, pair in zip(values, plan):
        if value is None:
            continue
        series, takes_exemplar = pair
        if takes_exemplar and trace_id:
            series.observe(value, trace_id)
            continue
        bounds = series.bounds
        index = _bucket_of(bounds, value)
        if index < 0:
            index = _bisect.bisect_left(bounds, value)
        counts = series.counts
        counts[index] += 1
        series.sum += value


def count_in_columns(pending, columns, breakdown):
    """`_hotpath_py.count_in_columns`: the bucket search over C doubles."""
    cdef Py_ssize_t index
    for field, start, bounds in columns:
        value = getattr(breakdown, field)
        if value is None:
            continue
        index = _bucket_of(bounds, value)
        if index < 0:
            index = _bisect.bisect_left(bounds, value)
        pending[start + index] += 1
