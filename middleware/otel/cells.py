"""The `gen_ai.*` metrics' own aggregation: one cell per (instrument, attribute set).

Per request a value costs a bisect and a few list and float updates under one lock: the
OpenTelemetry SDK's `record()` cleans and hashes the attributes of every call, many times that
(a request records seven values). The SDK reads the cells when a reader collects
(`middleware.otel.sdk`), the Prometheus side adds what is new since its last flush
(`middleware.otel.prometheus`). Cells are cumulative: totals since the cell was made.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from typing import Any

from middleware.otel.conventions import Instrument

AttributeValues = tuple[Any, ...]  # an instrument's attribute values, in its attribute order


class HistogramCell:
    __slots__ = (
        "attributes",
        "baselines",
        "bounds",
        "counts",
        "high",
        "instrument",
        "low",
        "start_ns",
        "total",
    )

    def __init__(self, instrument: Instrument, attributes: dict[str, Any]) -> None:
        self.instrument = instrument
        self.attributes = attributes
        self.bounds = instrument.boundaries
        self.counts = [0] * (len(self.bounds) + 1)  # their sum is the count
        self.total = 0.0
        self.low = math.inf
        self.high = -math.inf
        self.start_ns = time.time_ns()
        # Snapshots by collection time, for readers that want deltas (middleware.otel.sdk).
        self.baselines: dict[int, Any] = {}

    def add(self, value: float) -> None:
        """One value (the caller holds the table's lock)."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        if value < self.low:
            self.low = value
        if value > self.high:
            self.high = value

    def snapshot(self) -> tuple[list[int], int, float, float, float]:
        counts = list(self.counts)
        return counts, sum(counts), self.total, self.low, self.high


class CounterCell:
    __slots__ = ("attributes", "baselines", "instrument", "start_ns", "value")

    def __init__(self, instrument: Instrument, attributes: dict[str, Any]) -> None:
        self.instrument = instrument
        self.attributes = attributes
        self.value = 0
        self.start_ns = time.time_ns()
        self.baselines: dict[int, Any] = {}

    def add(self, amount: int) -> None:
        self.value += amount


Cell = HistogramCell | CounterCell


def attribute_values(instrument: Instrument, attributes: dict[str, Any]) -> AttributeValues:
    return tuple(attributes.get(key) for key in instrument.attributes)


class CellTable:
    """Every cell, by (instrument name, attribute values); made on first use, never removed
    (the attribute values are bounded: see `middleware.otel.models`)."""

    def __init__(self) -> None:
        self.cells: dict[tuple[str, AttributeValues], Cell] = {}

    def cell(self, instrument: Instrument, attributes: dict[str, Any]) -> tuple[Cell, bool]:
        """The cell of one attribute set (None values left out), and whether it is new."""
        attributes = {key: value for key, value in attributes.items() if value is not None}
        key = (instrument.name, attribute_values(instrument, attributes))
        found = self.cells.get(key)
        if found is not None:
            return found, False
        made: Cell = (
            HistogramCell(instrument, attributes)
            if instrument.kind == "histogram"
            else CounterCell(instrument, attributes)
        )
        self.cells[key] = made
        return made, True

    def find(self, name: str, values: AttributeValues) -> Cell | None:
        return self.cells.get((name, values))
