"""The `gen_ai.*` metrics on `/metrics`, under the names the OpenTelemetry-to-Prometheus rules
give them (`gen_ai_server_time_to_first_token_seconds`, labels such as
`gen_ai_operation_name`).

In one process they are read straight from the cells (`middleware.otel.cells`) when the
registry is collected: a collector of our own yields histogram and counter families through
prometheus_client's public API, so nothing is copied per request. With PROMETHEUS_MULTIPROC_DIR
set, a worker's values must reach prometheus_client's per-process files for `/metrics` to add
the workers up, as every `llm_slo_*` series does: there each request's values go to
prometheus_client histograms and counters (`observe`/`inc`) as they are recorded.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from middleware.metrics.prom_export import cumulative_buckets
from middleware.otel.cells import Cell, CounterCell, HistogramCell
from middleware.otel.conventions import Instrument


def _label_values(cell: Cell) -> list[str]:
    attributes = cell.attributes
    return [
        "" if attributes.get(key) is None else str(attributes[key])
        for key in cell.instrument.attributes
    ]


class PrometheusSide:
    """The instruments' families on the middleware's registry; `add_cell` exports a new
    attribute set from then on (at 0), `record` gives a request's values (multiprocess only:
    in one process the cells are read when collected)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        instruments: tuple[Instrument, ...],
        lock: threading.Lock,
        multiprocess: bool = False,
    ) -> None:
        self.instruments = instruments
        self.multiprocess = multiprocess
        self._lock = lock
        self._cells: dict[str, list[Cell]] = {spec.name: [] for spec in instruments}
        self._children: dict[int, Any] = {}  # id(cell) -> prometheus_client child
        self._metrics: dict[str, Any] = {}
        if not multiprocess:
            registry.register(_CellCollector(self))
            return
        for spec in instruments:
            labels = list(spec.prometheus_labels)
            if spec.kind == "histogram":
                self._metrics[spec.name] = Histogram(
                    spec.prometheus_name,
                    spec.description,
                    labelnames=labels,
                    buckets=spec.boundaries,
                    registry=registry,
                )
            else:  # prometheus_client adds the `_total` suffix itself
                self._metrics[spec.name] = Counter(
                    spec.prometheus_name.removesuffix("_total"),
                    spec.description,
                    labelnames=labels,
                    registry=registry,
                )

    def add_cell(self, cell: Cell) -> None:
        """Export a new cell from now on (its series appears at once, at 0)."""
        self._cells[cell.instrument.name].append(cell)
        if self.multiprocess:
            self._children[id(cell)] = self._metrics[cell.instrument.name].labels(
                *_label_values(cell)
            )

    def record(self, cells: Iterable[Cell | None], values: Iterable[Any]) -> None:
        """Multiprocess mode: one request's values, in the cells' order."""
        for cell, value in zip(cells, values, strict=True):
            if cell is None or value is None:
                continue
            child = self._children[id(cell)]
            if isinstance(cell, HistogramCell):
                child.observe(value)
            elif value:
                child.inc(value)

    def families(self) -> Iterator[Metric]:
        """Every instrument's family, read from its cells under the cells' lock."""
        with self._lock:
            rows = {
                name: [(_label_values(cell), _snapshot(cell)) for cell in cells]
                for name, cells in self._cells.items()
            }
        for spec in self.instruments:
            labels = list(spec.prometheus_labels)
            if spec.kind == "histogram":
                family: Metric = HistogramMetricFamily(
                    spec.prometheus_name, spec.description, labels=labels
                )
                les = [floatToGoString(bound) for bound in spec.boundaries] + ["+Inf"]
                for values, (counts, total) in rows[spec.name]:
                    family.add_metric(values, cumulative_buckets(les, counts), total)
            else:
                name = spec.prometheus_name.removesuffix("_total")
                family = CounterMetricFamily(name, spec.description, labels=labels)
                for values, (value, _) in rows[spec.name]:
                    family.add_metric(values, value)
            yield family


def _snapshot(cell: Cell) -> tuple[Any, float]:
    if isinstance(cell, CounterCell):
        return cell.value, 0.0
    return list(cell.counts), cell.total


class _CellCollector:
    """prometheus_client's view of the cells: families built at collection time."""

    def __init__(self, side: PrometheusSide) -> None:
        self._side = side

    def describe(self) -> list[Metric]:
        return []  # the names are known only by collecting; nothing to check them against

    def collect(self) -> Iterator[Metric]:
        return self._side.families()
