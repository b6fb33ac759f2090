"""The `gen_ai.*` instruments in an OpenTelemetry SDK MeterProvider, read from our cells.

Each convention instrument is created on the provider's meter with its unit and advisory
bucket boundaries, and a View gives it `CellAggregation`: the SDK asks it for one aggregation
per attribute set, and that aggregation reads the cell the middleware fills
(`middleware.otel.cells`) when a reader collects. So any reader sees them as SDK metrics
(InMemoryMetricReader, PeriodicExportingMetricReader with the OTLP exporter), cumulative or
delta as the reader prefers, while a request pays a bisect per value instead of `record()`.

The aggregation objects are the SDK's own classes (it tells a metric's data type by them) with
`aggregate`/`collect` replaced. The SDK learns an attribute set from one `record(0)` when its
cell is made (a marker the aggregation ignores), and again at every collection (the callback
of an instrument that reports nothing): a delta reader drops its aggregations after each one.

Where this extension point is not as expected (`bridge_works()` fails: an SDK that changed it)
or the MeterProvider is the caller's own (its Views are fixed), values go through `record()`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    HistogramDataPoint,
    MetricReader,
    NumberDataPoint,
)
from opentelemetry.sdk.metrics.view import (
    Aggregation,
    ExplicitBucketHistogramAggregation,
    SumAggregation,
    View,
)
from opentelemetry.sdk.resources import Resource

from middleware.otel.cells import (
    AttributeValues,
    CellTable,
    CounterCell,
    HistogramCell,
    attribute_values,
)
from middleware.otel.conventions import SCHEMA_URL, Instrument

logger = logging.getLogger("middleware.otel")

METER_NAME = "llm-slo.middleware"
SYNC_INSTRUMENT = "llm_slo.otel.attribute_sets"  # reports nothing: its callback is the hook
_BASELINES_KEPT = 8  # delta snapshots kept per cell (one per recent collection)


class _CellPoints:
    """Reads one attribute set's cell for the SDK when a reader collects."""

    def __init__(self, cell: Any, lock: threading.Lock, start_ns: int) -> None:
        self.cell = cell
        self.lock = lock
        self.start_ns = start_ns
        # What a delta collection last reported up to: a snapshot taken when this attribute
        # set's previous aggregation (dropped by the reader) was collected, else zero.
        self.last: Any = None if cell is None else cell.baselines.pop(start_ns, None)

    def collect(self, temporality: AggregationTemporality, now_ns: int) -> Any:
        cell = self.cell
        if cell is None:
            return None
        with self.lock:
            current = cell.snapshot() if isinstance(cell, HistogramCell) else cell.value
        if temporality is AggregationTemporality.CUMULATIVE:
            return _point(cell, current, None, cell.start_ns, now_ns)
        point = _point(cell, current, self.last, self.start_ns, now_ns)
        baselines = cell.baselines
        baselines[now_ns] = current
        while len(baselines) > _BASELINES_KEPT:
            baselines.pop(next(iter(baselines)))
        self.last, self.start_ns = current, now_ns
        return point


def _aggregate(self: Any, measurement: Any, should_sample_exemplar: bool = True) -> None:
    """Measurements are markers only: values reach the cell directly."""


def _collect(self: Any, temporality: AggregationTemporality, now_ns: int) -> Any:
    return self.cell_points.collect(temporality, now_ns)


# The SDK's own aggregation classes (it tells a metric's data type by them), with `aggregate`
# and `collect` replaced (a direct subclass: the instance layout must stay the SDK class's).
# Without them (internal names), record() is used instead.
try:
    from opentelemetry.sdk.metrics._internal.aggregation import (
        _ExplicitBucketHistogramAggregation,
        _SumAggregation,
    )

    _READS_CELL = {"aggregate": _aggregate, "collect": _collect}
    _FROM_CELL: dict[str, type] | None = {
        "histogram": type(
            "_HistogramFromCell", (_ExplicitBucketHistogramAggregation,), _READS_CELL
        ),
        "counter": type("_SumFromCell", (_SumAggregation,), _READS_CELL),
    }
except ImportError:  # pragma: no cover - an SDK without them
    _FROM_CELL = None


def _point(cell: Any, current: Any, last: Any, start_ns: int, now_ns: int) -> Any:
    attributes = cell.attributes
    if isinstance(cell, CounterCell):
        value = current - (last or 0)
        if last is not None and value == 0:
            return None
        return NumberDataPoint(attributes, start_ns, now_ns, value)
    counts, count, total, low, high = current
    if last is not None:
        counts = [now - before for now, before in zip(counts, last[0], strict=True)]
        count, total = count - last[1], total - last[2]
        if count == 0:
            return None
    if count == 0:
        low = high = 0.0
    return HistogramDataPoint(
        attributes, start_ns, now_ns, count, total, tuple(counts), cell.bounds, low, high
    )


class CellAggregation(Aggregation):
    """The aggregation a View gives one convention instrument: its cells, as the SDK's."""

    def __init__(self, table: CellTable, lock: threading.Lock, instrument: Instrument) -> None:
        self.table = table
        self.lock = lock
        self.instrument = instrument

    # The SDK's signature has grown over releases (reservoir factory, start time last).
    def _create_aggregation(self, instrument: Any, attributes: Any, *rest: Any) -> Any:
        """The SDK's own aggregation for this attribute set, made to read our cell."""
        spec = self.instrument
        if _FROM_CELL is None:
            raise TypeError("this SDK lacks the aggregation classes llm-slo reads cells into")
        public: Aggregation = (
            ExplicitBucketHistogramAggregation(spec.boundaries)
            if spec.kind == "histogram"
            else SumAggregation()
        )
        made = public._create_aggregation(instrument, attributes, *rest)
        start_ns = rest[-1] if rest and isinstance(rest[-1], int) else time.time_ns()
        values: AttributeValues = attribute_values(spec, dict(attributes or {}))
        made.__class__ = _FROM_CELL[spec.kind]
        made.cell_points = _CellPoints(self.table.find(spec.name, values), self.lock, start_ns)
        return made


def create_instruments(meter: Any, instruments: Iterable[Instrument]) -> dict[str, Any]:
    made: dict[str, Any] = {}
    for spec in instruments:
        if spec.kind == "histogram":
            made[spec.name] = meter.create_histogram(
                spec.name,
                unit=spec.unit,
                description=spec.description,
                explicit_bucket_boundaries_advisory=list(spec.boundaries),
            )
        else:
            made[spec.name] = meter.create_counter(
                spec.name, unit=spec.unit, description=spec.description
            )
    return made


def cell_views(
    table: CellTable, lock: threading.Lock, instruments: Iterable[Instrument]
) -> list[View]:
    return [
        View(instrument_name=spec.name, aggregation=CellAggregation(table, lock, spec))
        for spec in instruments
    ]


def resource() -> Resource:
    """The SDK's resource from OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES, with a
    `service.instance.id` of this process unless one is set: each worker of a multi-worker
    server exports its own cumulative series, which a backend adds up only if they differ."""
    found = Resource.create()
    if found.attributes.get("service.instance.id"):
        return found
    return found.merge(Resource({"service.instance.id": str(uuid.uuid4())}))


def _exporters_named() -> list[str]:
    names = os.environ.get("OTEL_METRICS_EXPORTER", "").split(",")
    return [name.strip().lower() for name in names if name.strip()]


def metrics_wanted(
    explicit: bool | None, tracing: bool, meter_provider: Any, readers: Sequence[Any]
) -> bool:
    """Whether to make the `gen_ai.*` metrics: as asked; else when OpenTelemetry is on (a
    provider or readers passed in, spans exported, or OTEL_METRICS_EXPORTER / an OTLP endpoint
    set; `OTEL_METRICS_EXPORTER=prometheus` for /metrics alone). Off, they cost nothing."""
    if explicit is not None:
        return explicit
    if meter_provider is not None or readers:
        return True
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    endpoint = any(
        os.environ.get(name)
        for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    )
    named = [name for name in _exporters_named() if name != "none"]
    return tracing or bool(named) or (endpoint and not _exporters_named())


def readers_from_environment() -> list[MetricReader]:
    """Push readers the standard variables ask for: OTEL_METRICS_EXPORTER=otlp|console (or an
    OTLP endpoint set without it); none when OTEL_SDK_DISABLED=true."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = _exporters_named()
    if not names and any(
        os.environ.get(name)
        for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    ):
        names = ["otlp"]
    readers: list[MetricReader] = []
    for name in names:
        reader = _reader(name)
        if reader is not None:
            readers.append(reader)
    return readers


def _reader(name: str) -> MetricReader | None:
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )

    if name == "console":
        return PeriodicExportingMetricReader(ConsoleMetricExporter())
    if name in ("none", "prometheus"):  # /metrics serves the Prometheus side already
        return None
    if name != "otlp":
        logger.warning("OTEL_METRICS_EXPORTER=%s is not supported (use otlp or console)", name)
        return None
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    )
    if protocol.strip().lower() not in ("", "http/protobuf"):
        logger.warning(
            "OTEL_EXPORTER_OTLP_PROTOCOL=%s: llm-slo exports OTLP over HTTP (http/protobuf) only;"
            " set it to http/protobuf and point the endpoint at the collector's HTTP port (4318)",
            protocol,
        )
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError:
        logger.warning(
            "OTEL_METRICS_EXPORTER=otlp needs `pip install opentelemetry-exporter-otlp-proto-http`"
        )
        return None
    return PeriodicExportingMetricReader(OTLPMetricExporter())


def build_provider(
    readers: Sequence[MetricReader],
    table: CellTable,
    lock: threading.Lock,
    instruments: Sequence[Instrument],
) -> MeterProvider:
    return MeterProvider(
        metric_readers=list(readers),
        resource=resource(),
        views=cell_views(table, lock, instruments),
        shutdown_on_exit=False,  # LatencyMiddleware.close() shuts it down (lifespan, CLI)
    )


def get_meter(provider: Any) -> Any:
    return provider.get_meter(METER_NAME, schema_url=SCHEMA_URL)


def bridge_works() -> bool:
    """Whether this SDK builds our aggregation through a View and collects what a cell holds."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    spec = Instrument("llm_slo.self_test", "histogram", "s", "", ("k",), (1.0,))
    table, lock, reader = CellTable(), threading.Lock(), InMemoryMetricReader()
    try:
        provider = MeterProvider(
            metric_readers=[reader],
            views=cell_views(table, lock, [spec]),
            shutdown_on_exit=False,
        )
        histogram = create_instruments(provider.get_meter("self-test"), [spec])[spec.name]
        cell, _ = table.cell(spec, {"k": "v"})
        histogram.record(0, {"k": "v"})
        cell.add(0.5)
        data = reader.get_metrics_data()
        provider.shutdown()
        points = [
            point
            for resource_metrics in (data.resource_metrics if data else ())
            for scope in resource_metrics.scope_metrics
            for metric in scope.metrics
            for point in metric.data.data_points
        ]
        return len(points) == 1 and points[0].count == 1 and points[0].sum == 0.5
    except Exception:  # any change of the extension point: use record() instead
        logger.warning("llm-slo: gen_ai metrics go through record(): the SDK's View hook differs")
        return False
