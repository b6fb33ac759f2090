"""Histograms of our own, exported through prometheus_client's public collector API.

prometheus_client's `Histogram.observe` takes a lock and scans the buckets for every value, and
it offers no public way to add many values at once; a streamed request feeds a dozen
histograms and every inter-token gap. So in a single process the middleware keeps each label
set's bucket counts and sum in plain lists (`HistogramSeries`: a bisect and two increments per
value, under the caller's one lock per request) and `OwnHistogram.collect` turns them into a
`HistogramMetricFamily` when the registry is read: the same `_bucket`/`_count`/`_sum` series a
prometheus_client histogram exposes (cumulative buckets, `le` written as it writes them,
exemplars in OpenMetrics), without a `_created` series.

With PROMETHEUS_MULTIPROC_DIR set, values must reach prometheus_client's per-process files for
`/metrics` to add up the workers: there the middleware uses its `Histogram` and `observe` per
value (see `middleware.metrics.instruments.histogram`).
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

# A bucket's last exemplar as observed: (its labels, or a trace id alone; value; unix time).
# It becomes an `Exemplar` only when a scrape reads it: most are replaced before that.
RawExemplar = tuple[dict[str, str] | str, float, float]


class HistogramSeries:
    """One label set: non-cumulative bucket counts (`counts[i]` for values <= bounds[i], the
    last for +Inf), their sum, and the last exemplar of each bucket."""

    __slots__ = ("bounds", "counts", "exemplars", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.exemplars: list[RawExemplar | None] = [None] * (len(bounds) + 1)

    def observe(self, value: float, exemplar: dict[str, str] | str | None = None) -> None:
        """One value (the caller serializes calls, as the middleware's lock does); `exemplar`:
        its labels, or a trace id (the label `trace_id`)."""
        index = bisect_left(self.bounds, value)
        self.counts[index] += 1
        self.sum += value
        if exemplar:
            self.exemplars[index] = (exemplar, value, time.time())


def _exemplar(raw: RawExemplar | None) -> Exemplar | None:
    if raw is None:
        return None
    labels, value, timestamp = raw
    return Exemplar({"trace_id": labels} if isinstance(labels, str) else labels, value, timestamp)


class OwnHistogram:
    """A histogram family: `labels(...)` gives a label set's `HistogramSeries` (made at 0, so
    its series is exported from the start); the registry reads them all through `collect`.

    `lock`: held while a scrape copies the counts, so it never sees a value counted in a bucket
    but not yet in the sum (pass the lock the feeders hold).
    """

    def __init__(
        self,
        registry: CollectorRegistry | None,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        bounds: Sequence[float],
        lock: threading.Lock | None = None,
    ) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError(f"{name}: bucket bounds must be distinct and ascending: {bounds}")
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(float(bound) for bound in bounds if bound != float("inf"))
        self._les = [floatToGoString(bound) for bound in self.bounds] + ["+Inf"]
        self._series: dict[tuple[str, ...], HistogramSeries] = {}
        self._lock = lock or threading.Lock()
        if registry is not None:
            registry.register(self)

    def labels(self, *values: Any, **labels: Any) -> HistogramSeries:
        if labels:
            values = tuple(labels[name] for name in self.labelnames)
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: labels {self.labelnames}, got {values}")
        key = tuple(str(value) for value in values)
        series = self._series.get(key)
        if series is None:
            series = self._series.setdefault(key, HistogramSeries(self.bounds))
        return series

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            rows = [
                (key, list(series.counts), series.sum, [_exemplar(e) for e in series.exemplars])
                for key, series in list(self._series.items())
            ]
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, counts, total, exemplars in rows:
            family.add_metric(list(key), cumulative_buckets(self._les, counts, exemplars), total)
        yield family


def cumulative_buckets(
    les: list[str], counts: list[int], exemplars: list[Exemplar | None] | None = None
) -> list[tuple[Any, ...]]:
    """`(le, cumulative count[, exemplar])` per bucket, as HistogramMetricFamily takes them."""
    buckets: list[tuple[Any, ...]] = []
    running = 0
    for index, (le, count) in enumerate(zip(les, counts, strict=True)):
        running += count
        exemplar = exemplars[index] if exemplars is not None else None
        buckets.append((le, running) if exemplar is None else (le, running, exemplar))
    return buckets
