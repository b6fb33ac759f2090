# The usual delta, decided on the bytes (included by _hotpath.pyx).
#
# Nearly every event of a stream is one chunk with one choice whose text is a non-empty string
# and nothing else that counts (no usage, error, finish, nor an object beside the choices: an
# engine's report, `EngineAdapter.body_keys`, is always decoded). `_usual_delta` says so from a
# single pass over the payload, without msgspec building its structs. It answers 1 only inside
# a strict subset of JSON that msgspec surely decodes to that same verdict: plain keys, known
# fields of the types the structs take, at most one of each, valid UTF-8, no surrogate escapes,
# modest numbers and depth, nothing after the object. Anything else (a finish or usage chunk,
# an unusual but valid payload, invalid JSON) answers 0 and msgspec decides, as in the
# pure-Python path; so being stricter than msgspec is always safe, never looser.

cdef enum:
    _MAX_DEPTH = 32


cdef struct _Cursor:
    const unsigned char* at
    const unsigned char* end


cdef struct _Span:
    # Where the string that decided the verdict lies: its opening and its closing quote.
    const unsigned char* opening
    const unsigned char* closing


cdef inline void _space(_Cursor* c) noexcept nogil:
    while c.at < c.end and (c.at[0] == 32 or c.at[0] == 9 or c.at[0] == 10 or c.at[0] == 13):
        c.at += 1


cdef inline bint _take(_Cursor* c, unsigned char wanted) noexcept nogil:
    _space(c)
    if c.at < c.end and c.at[0] == wanted:
        c.at += 1
        return True
    return False


cdef inline int _hex(unsigned char ch) noexcept nogil:
    if 48 <= ch <= 57:
        return ch - 48
    if 97 <= ch <= 102:
        return ch - 87
    if 65 <= ch <= 70:
        return ch - 55
    return -1


cdef Py_ssize_t _utf8_tail(const unsigned char* at, const unsigned char* end) noexcept nogil:
    """Bytes in the valid UTF-8 sequence starting at `at` (a byte >= 0x80), or 0."""
    cdef unsigned char lead = at[0]
    cdef Py_ssize_t size, index
    cdef unsigned char low = 0x80, high = 0xBF
    if 0xC2 <= lead <= 0xDF:
        size = 2
    elif 0xE0 <= lead <= 0xEF:
        size = 3
        if lead == 0xE0:
            low = 0xA0  # no overlong forms
        elif lead == 0xED:
            high = 0x9F  # no surrogates
    elif 0xF0 <= lead <= 0xF4:
        size = 4
        if lead == 0xF0:
            low = 0x90
        elif lead == 0xF4:
            high = 0x8F  # nothing past U+10FFFF
    else:
        return 0
    if end - at < size or not (low <= at[1] <= high):
        return 0
    for index in range(2, size):
        if not (0x80 <= at[index] <= 0xBF):
            return 0
    return size


cdef int _string(_Cursor* c, bint* escaped) noexcept nogil:
    """A JSON string at the cursor (at its quote): its raw length, or -1 outside the subset."""
    cdef const unsigned char* start
    cdef unsigned char ch
    cdef Py_ssize_t step
    cdef int code, index, digit
    if c.at >= c.end or c.at[0] != 34:
        return -1
    c.at += 1
    start = c.at
    while c.at < c.end:
        ch = c.at[0]
        if ch == 34:
            c.at += 1
            return <int>(c.at - 1 - start)
        if ch == 92:
            escaped[0] = True
            if c.end - c.at < 2:
                return -1
            ch = c.at[1]
            if ch == 117:  # \uXXXX, surrogates left to msgspec
                if c.end - c.at < 6:
                    return -1
                code = 0
                for index in range(2, 6):
                    digit = _hex(c.at[index])
                    if digit < 0:
                        return -1
                    code = code * 16 + digit
                if 0xD800 <= code <= 0xDFFF:
                    return -1
                c.at += 6
            elif ch in (34, 92, 47, 98, 102, 110, 114, 116):
                c.at += 2
            else:
                return -1
        elif ch < 32:
            return -1
        elif ch < 128:
            c.at += 1
        else:
            step = _utf8_tail(c.at, c.end)
            if step == 0:
                return -1
            c.at += step
    return -1


cdef int _digits(_Cursor* c, int most) noexcept nogil:
    """How many digits at the cursor (taken), or -1 for none or more than `most`."""
    cdef int count = 0
    while c.at < c.end and 48 <= c.at[0] <= 57:
        c.at += 1
        count += 1
    return count if 0 < count <= most else -1


cdef int _number(_Cursor* c) noexcept nogil:
    """A JSON number an int64 or a double holds (else -1: msgspec decides)."""
    if c.at < c.end and c.at[0] == 45:
        c.at += 1
    if c.at < c.end and c.at[0] == 48:
        c.at += 1
        if c.at < c.end and 48 <= c.at[0] <= 57:
            return -1
    elif _digits(c, 18) < 0:
        return -1
    if c.at < c.end and c.at[0] == 46:
        c.at += 1
        if _digits(c, 20) < 0:
            return -1
    if c.at < c.end and (c.at[0] == 101 or c.at[0] == 69):
        c.at += 1
        if c.at < c.end and (c.at[0] == 43 or c.at[0] == 45):
            c.at += 1
        if _digits(c, 2) < 0:
            return -1
    return 0


cdef inline bint _word(_Cursor* c, const char* word, Py_ssize_t size) noexcept nogil:
    if c.end - c.at >= size and memcmp(c.at, word, size) == 0:
        c.at += size
        return True
    return False


cdef int _skip(_Cursor* c, int depth) noexcept nogil:
    """Any JSON value in the subset (0), or -1."""
    cdef bint escaped = False
    _space(c)
    if c.at >= c.end or depth > _MAX_DEPTH:
        return -1
    if c.at[0] == 34:
        return 0 if _string(c, &escaped) >= 0 else -1
    if c.at[0] == 123 or c.at[0] == 91:
        return _skip_container(c, depth)
    if _word(c, "null", 4) or _word(c, "true", 4) or _word(c, "false", 5):
        return 0
    return _number(c)


cdef int _skip_container(_Cursor* c, int depth) noexcept nogil:
    cdef bint is_object = c.at[0] == 123, escaped = False
    cdef unsigned char close = 125 if is_object else 93
    c.at += 1
    if _take(c, close):
        return 0
    while True:
        if is_object:
            _space(c)
            if _string(c, &escaped) < 0 or not _take(c, 58):
                return -1
        if _skip(c, depth + 1) < 0:
            return -1
        if _take(c, close):
            return 0
        if not _take(c, 44):
            return -1


cdef int _key(_Cursor* c, const unsigned char** name) noexcept nogil:
    """The next plain key of an object (`name`) and its colon: its length, or -1 outside the
    subset."""
    cdef bint escaped = False
    cdef int size
    _space(c)
    name[0] = c.at + 1
    size = _string(c, &escaped)
    if size < 0 or escaped or not _take(c, 58):
        return -1
    _space(c)
    return size


cdef inline bint _is(const unsigned char* name, int size, const char* field) noexcept nogil:
    return size == <int>strlen(field) and memcmp(name, field, size) == 0


cdef inline int _next(_Cursor* c) noexcept nogil:
    """After a member: 1 for another, 0 at the object's end, -1 otherwise."""
    if _take(c, 44):
        return 1
    return 0 if _take(c, 125) else -1


cdef int _text_field(_Cursor* c, int* text, _Span* span) noexcept nogil:
    """A field the structs take as Any that may hold the text: `text` is 1 for a non-empty
    string (`span` says where it lies), else 0 (the value skipped)."""
    cdef bint escaped = False
    cdef int size
    text[0] = 0
    if c.at < c.end and c.at[0] == 34:
        span.opening = c.at
        size = _string(c, &escaped)
        span.closing = c.at - 1
        text[0] = size > 0
        return 0 if size >= 0 else -1
    return _skip(c, 3)


cdef inline bint _null(_Cursor* c) noexcept nogil:
    return _word(c, "null", 4)


cdef int _member(_Cursor* c, int* seen, int bit) noexcept nogil:
    """A known field once only (msgspec would keep the last of two), then the next member."""
    if seen[0] & bit:
        return -1
    seen[0] |= bit
    return _next(c)


cdef int _delta(_Cursor* c, _Span* span) noexcept nogil:
    """A `delta` object (cursor at its brace): 1 when its content is a non-empty string, 0 when
    not, -1 outside the subset."""
    cdef const unsigned char* name
    cdef int size, more, seen = 0, text = 0
    cdef bint escaped = False
    c.at += 1
    if _take(c, 125):
        return 0
    while True:
        size = _key(c, &name)
        if size < 0:
            return -1
        if _is(name, size, "content"):
            more = -1 if _text_field(c, &text, span) < 0 else _member(c, &seen, 1)
        elif _is(name, size, "reasoning_content") or _is(name, size, "reasoning"):
            if not _null(c) and _string(c, &escaped) < 0:  # str | None
                return -1
            more = _member(c, &seen, 2 if name[9] == 95 else 4)
        elif _is(name, size, "tool_calls"):
            more = _member(c, &seen, 8) if _null(c) else -1
        else:
            more = _next(c) if _skip(c, 3) == 0 else -1
        if more <= 0:
            return text if more == 0 else -1


cdef int _choice(_Cursor* c, _Span* span) noexcept nogil:
    """The one choice (cursor past its brace): 1 when it is the usual token (text, no finish;
    `span`: the text's string), else 0 or -1."""
    cdef const unsigned char* name
    cdef int size, more, seen = 0, text = 0, delta = -1
    cdef _Span text_span, content_span
    if _take(c, 125):
        return 0
    while True:
        size = _key(c, &name)
        if size < 0:
            return -1
        if _is(name, size, "delta"):
            if _null(c):
                delta = -1
            elif c.at < c.end and c.at[0] == 123:
                delta = _delta(c, &content_span)
                if delta < 0:
                    return -1
            else:
                return -1
            more = _member(c, &seen, 1)
        elif _is(name, size, "text"):
            more = -1 if _text_field(c, &text, &text_span) < 0 else _member(c, &seen, 2)
        elif _is(name, size, "finish_reason") or _is(name, size, "message"):
            more = _member(c, &seen, 4 if name[0] == 102 else 8) if _null(c) else -1
        else:
            more = _next(c) if _skip(c, 3) == 0 else -1
        if more <= 0:
            if more < 0:
                return -1
            span[0] = text_span if delta < 0 else content_span
            return text if delta < 0 else delta


cdef inline bint _opens_object(_Cursor* c) noexcept nogil:
    _space(c)
    return c.at < c.end and c.at[0] == 123


cdef int _usual_delta(const unsigned char* payload, Py_ssize_t size, _Span* span) noexcept nogil:
    """1 when the payload (a JSON object) is surely the usual token chunk, else 0: decode it.
    On 1, `span` says where its text's string lies."""
    cdef _Cursor c
    cdef const unsigned char* name
    cdef int length, more, seen = 0, usual = 0
    c.at = payload
    c.end = payload + size
    if not _take(&c, 123) or _take(&c, 125):
        return 0
    while True:
        length = _key(&c, &name)
        if length < 0:
            return 0
        if _is(name, length, "choices"):
            if not _take(&c, 91) or not _take(&c, 123) or _choice(&c, span) != 1 or not _take(&c, 93):
                return 0
            usual = 1
            more = _member(&c, &seen, 1)
        elif _is(name, length, "usage"):
            more = _member(&c, &seen, 2) if _null(&c) else -1
        elif _is(name, length, "error"):
            more = _member(&c, &seen, 8) if _null(&c) else -1
        elif _opens_object(&c):
            return 0  # an engine's report, maybe (`EngineAdapter.body_keys`): decode it
        else:
            more = _next(&c) if _skip(&c, 1) == 0 else -1
        if more <= 0:
            break
    _space(&c)
    return usual if more == 0 and c.at == c.end else 0


cdef int _same_shape(const unsigned char* data, Py_ssize_t size, bytes head, bytes tail) noexcept:
    """1 when `data` is `head`, a string's body, `tail`: the last usual token event of the
    stream (cut around its text's string: `head` ends with its opening quote, `tail` starts
    with its closing one) with other text, non-empty and in the subset. Everything but the
    text is the same bytes, so the verdict is the same: the usual token. Else 0: scan it."""
    cdef Py_ssize_t head_size = len(head), tail_size = len(tail)
    cdef _Cursor c
    cdef bint escaped = False
    if size < head_size + tail_size:
        return 0
    if memcmp(data, PyBytes_AS_STRING(head), head_size) != 0:
        return 0
    if memcmp(data + size - tail_size, PyBytes_AS_STRING(tail), tail_size) != 0:
        return 0
    c.at = data + head_size - 1  # the opening quote
    c.end = data + size - tail_size + 1  # past the closing quote: the string must end there
    if _string(&c, &escaped) <= 0 or c.at != c.end:
        return 0
    return 1
