# The compiled timings comment (`_hotpath.pyx` includes it): the server's phases as the final
# SSE comment, written into a C buffer.

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
