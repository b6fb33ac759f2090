# The counting half of the compiled hot path (`_hotpath.pyx` includes it): gaps between marks,
# bucket counts, the live windows' rings, and the values a request adds to the histograms.

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
