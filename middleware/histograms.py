"""Feeding prometheus_client histograms cheaply: bucket counts of many values at once, and
per-request observations counted in plain lists and added to the children in batches.

prometheus_client's `observe` takes a lock and scans the buckets per value; a streamed request
feeds a dozen histograms and every inter-token gap. Here a value costs a bisect and two list
increments, and a stream's gaps a sort; a flush adds one increment per touched bucket to the
children's bucket values and sums (prometheus_client internals, stable since 0.4: used only
where they look as expected, else `observe`). The work stays spread over the requests: a flush
never buckets anything, so it never stalls the event loop.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import middleware.hotpath as hotpath
from middleware._hotpath_py import BucketCounts as BucketCounts

# `bucket_counts(bounds, values) -> [(index, count), ...]` for every bucket the values fall
# in, index as Prometheus places a value: `bisect_left(bounds, value)` (upper bounds inclusive;
# `len(bounds)` is +Inf). Values in few buckets are counted with a sort and a few bisects per
# touched bucket instead of one bisect per value; compiled where built (`middleware.hotpath`).
bucket_counts = hotpath.bucket_counts


def fast_parts(child: Any, bounds: Sequence[float]) -> tuple[Any, Any] | None:
    """A histogram child's bucket values and sum, or None where they are not as expected."""
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if buckets is None or total is None or len(buckets) != len(bounds) + 1:
        return None
    return buckets, total


def observe_one(child: Any, bounds: tuple[float, ...], value: float) -> None:
    """`child.observe(value)` without the per-call checks and the linear bucket scan."""
    parts = fast_parts(child, bounds)
    if parts is None:
        child.observe(value)
        return
    parts[0][bisect_left(bounds, value)].inc(1)
    parts[1].inc(value)


def observe_many(child: Any, bounds: tuple[float, ...], values: Iterable[float]) -> None:
    """Observe many values on one histogram child with one increment per touched bucket."""
    values = values if isinstance(values, list | tuple) else list(values)
    parts = fast_parts(child, bounds)
    if parts is None:
        for value in values:
            child.observe(value)
        return
    buckets, total = parts
    for index, count in bucket_counts(bounds, values):
        buckets[index].inc(count)
    total.inc(sum(values))


class HistogramBatch:
    """Pending observations of some histogram children (one label set), laid out flat.

    `counts[offsets[i] + bucket]` and `sums[i]` collect what `children[i]` was fed since the
    last `flush`. Not thread-safe by itself: the owner serializes feeding and flushing.
    """

    __slots__ = ("counts", "dirty", "offsets", "parts", "sums")

    def __init__(self, children: Sequence[Any], bounds: Sequence[Sequence[float]]) -> None:
        parts = [
            fast_parts(child, child_bounds)
            for child, child_bounds in zip(children, bounds, strict=True)
        ]
        if any(part is None for part in parts):
            raise ValueError("histogram children without the expected bucket values")
        self.parts: list[tuple[Any, Any]] = parts  # type: ignore[assignment]
        self.offsets: list[int] = []
        width = 0
        for child_bounds in bounds:
            self.offsets.append(width)
            width += len(child_bounds) + 1
        self.counts = [0] * width
        self.sums = [0.0] * len(parts)
        self.dirty = False

    def flush(self) -> None:
        """Add the pending counts and sums to the children, and start over."""
        if not self.dirty:
            return
        counts, sums = self.counts, self.sums
        self.counts, self.sums, self.dirty = [0] * len(counts), [0.0] * len(sums), False
        for (buckets, total), offset, summed in zip(self.parts, self.offsets, sums, strict=True):
            for index, count in enumerate(counts[offset : offset + len(buckets)]):
                if count:
                    buckets[index].inc(count)
            if summed:
                total.inc(summed)


class _Flushable(Protocol):
    def flush(self) -> None: ...


class FlushOnCollect:
    """A collector of nothing, registered before the metrics it serves: reading the registry
    first flushes the observations `owner` batched since the last read."""

    def __init__(self, owner: _Flushable) -> None:
        self._owner = owner

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> list[Any]:
        self._owner.flush()
        return []
