"""Bucketing many values at once, and flushing what waits before a registry is read.

A stream's inter-token gaps are counted on a histogram's buckets with a sort and a few bisects
per touched bucket (`bucket_counts`), shared by the Prometheus histogram
(`middleware.metrics.prom_export`) and the live windows. `FlushOnCollect` lets whoever reads the
registry see the counts that wait in plain lists (the request counter's, the token counter's).
"""

from __future__ import annotations

from typing import Any, Protocol

import middleware.hotpath as hotpath
from middleware._hotpath_py import BucketCounts as BucketCounts

# `bucket_counts(bounds, values) -> [(index, count), ...]` for every bucket the values fall
# in, index as Prometheus places a value: `bisect_left(bounds, value)` (upper bounds inclusive;
# `len(bounds)` is +Inf). Values in few buckets are counted with a sort and a few bisects per
# touched bucket instead of one bisect per value; compiled where built (`middleware.hotpath`).
bucket_counts = hotpath.bucket_counts


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
