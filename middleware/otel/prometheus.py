"""The `gen_ai.*` metrics on `/metrics`, under the names the OpenTelemetry-to-Prometheus rules
give them (`gen_ai_server_time_to_first_token_seconds`, labels such as
`gen_ai_operation_name`).

They are prometheus_client histograms and counters in the middleware's registry, fed from the
cells with what is new since the last flush (one increment per touched bucket, as
`middleware.histograms` feeds the `llm_slo_*` histograms). So a multi-worker server adds them
up like every `llm_slo_*` series: with PROMETHEUS_MULTIPROC_DIR set, prometheus_client keeps
each worker's values in its files and `/metrics` sums them.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from middleware.histograms import fast_parts
from middleware.otel.cells import Cell, CounterCell, HistogramCell
from middleware.otel.conventions import Instrument

logger = logging.getLogger("middleware.otel")


class _Fed:
    """One cell's Prometheus child and what it has been given so far."""

    __slots__ = ("cell", "child", "given", "given_total", "parts")

    def __init__(self, cell: Cell, child: Any, parts: Any) -> None:
        self.cell = cell
        self.child = child
        self.parts = parts
        self.given: list[int] | int = (
            [0] * len(cell.counts) if isinstance(cell, HistogramCell) else 0
        )
        self.given_total = 0.0


class PrometheusSide:
    def __init__(self, registry: CollectorRegistry, instruments: tuple[Instrument, ...]) -> None:
        self.metrics: dict[str, Any] = {}
        for spec in instruments:
            labels = list(spec.prometheus_labels)
            if spec.kind == "histogram":
                self.metrics[spec.name] = Histogram(
                    spec.prometheus_name,
                    spec.description,
                    labelnames=labels,
                    buckets=spec.boundaries,
                    registry=registry,
                )
            else:  # prometheus_client adds the `_total` suffix itself
                self.metrics[spec.name] = Counter(
                    spec.prometheus_name.removesuffix("_total"),
                    spec.description,
                    labelnames=labels,
                    registry=registry,
                )
        self._fed: list[_Fed] = []

    def add_cell(self, cell: Cell) -> None:
        """Export a new cell from now on (its series appears at once, at 0)."""
        spec = cell.instrument
        values = ["" if cell.attributes.get(key) is None else str(cell.attributes[key])
                  for key in spec.attributes]  # fmt: skip
        child = self.metrics[spec.name].labels(*values)
        parts = None
        if isinstance(cell, HistogramCell):
            parts = fast_parts(child, cell.bounds)
            if parts is None:
                logger.warning("llm-slo: %s is not exported to /metrics: prometheus_client's "
                               "histograms are not as expected", spec.prometheus_name)  # fmt: skip
                return
        self._fed.append(_Fed(cell, child, parts))

    def flush(self) -> None:
        """Give every child what its cell gained since the last flush (the caller holds the
        cells' lock)."""
        for fed in self._fed:
            cell = fed.cell
            if isinstance(cell, CounterCell):
                gained = cell.value - fed.given  # type: ignore[operator]
                if gained:
                    fed.child.inc(gained)
                    fed.given = cell.value
                continue
            given: list[int] = fed.given  # type: ignore[assignment]
            if cell.count == sum(given):
                continue
            buckets, total = fed.parts
            for index, count in enumerate(cell.counts):
                if count != given[index]:
                    buckets[index].inc(count - given[index])
                    given[index] = count
            total.inc(cell.total - fed.given_total)
            fed.given_total = cell.total
