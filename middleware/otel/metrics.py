"""`GenAIMetrics`: the conventions' server metrics and token usage for every measured request.

    gen_ai.server.request.duration            every request, error.type on failures
    gen_ai.server.time_to_first_token         successful responses
    gen_ai.server.time_per_output_token       successful responses with two tokens or more
    gen_ai.client.inference.operation.{input,output}_tokens   every request (0 if none)
    gen_ai.client.inference.usage.{input,output}_tokens       counters, by gen_ai.token.modality

Attributes: gen_ai.operation.name, gen_ai.provider.name, gen_ai.request.model and
gen_ai.response.model (bounded: `middleware.otel.models`), error.type where the instrument
has it. `server.address`/`server.port` (recommended) are left off the metrics: a server
reporting its own address adds a label every series of a replica shares, which the
Prometheus target and the OTLP resource already carry; the request span has them.

Values land in cells (`middleware.otel.cells`) under one lock per request; the SDK reads them
when a reader collects (`middleware.otel.sdk`), `/metrics` reads them when it is scraped
(`middleware.otel.prometheus`; with PROMETHEUS_MULTIPROC_DIR, each value goes to
prometheus_client as it is recorded).
The `ok` series of each operation and listed model exist from startup, at 0.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from prometheus_client import CollectorRegistry

import middleware.otel.conventions as c
import middleware.otel.sdk as sdk
from middleware.otel.cells import Cell, CellTable, HistogramCell
from middleware.otel.models import ModelLabels
from middleware.otel.prometheus import PrometheusSide
from middleware.otel.request import GenAIRequest
from middleware.request.timeline import Breakdown

FLUSH_EVERY_S = 1.0
# (operation, request model label, response model label, error type)
BoundKey = tuple[str, str | None, str | None, str | None]


class _Bound:
    """One attribute set's cells, made once: the request path only adds to them."""

    __slots__ = ("cells", "duration", "input_tokens", "output_tokens", "tpot", "ttft", "usage")

    def __init__(self, cells: dict[str, Cell]) -> None:
        self.cells = cells
        self.duration: Any = cells[c.REQUEST_DURATION.name]
        self.ttft: Any = cells.get(c.TIME_TO_FIRST_TOKEN.name)
        self.tpot: Any = cells.get(c.TIME_PER_OUTPUT_TOKEN.name)
        self.input_tokens: Any = cells[c.OPERATION_INPUT_TOKENS.name]
        self.output_tokens: Any = cells[c.OPERATION_OUTPUT_TOKENS.name]
        self.usage = (cells[c.USAGE_INPUT_TOKENS.name], cells[c.USAGE_OUTPUT_TOKENS.name])

    def in_order(self) -> tuple[Any, ...]:
        """The cells in the order `GenAIMetrics.observe` gives its values."""
        single = (self.duration, self.ttft, self.tpot, self.input_tokens, self.output_tokens)
        return (*single, *self.usage)


def token_modality(operation: str, direction: str) -> str:
    """`gen_ai.token.modality`: the legacy completions API is text both ways, a chat answer we
    count is text; a chat prompt may carry images the usage does not break down: unknown."""
    if operation == c.CHAT and direction == "input":
        return "unknown"
    return "text"


class GenAIMetrics:
    def __init__(
        self,
        *,
        provider: str,
        labels: ModelLabels,
        registry: CollectorRegistry,
        operations: Iterable[str],
        multiprocess: bool = False,
        meter_provider: Any | None = None,
        metric_readers: Sequence[Any] = (),
    ) -> None:
        self.provider = provider
        self.labels = labels
        self.lock = threading.Lock()
        self.table = CellTable()
        self.prometheus = PrometheusSide(registry, c.INSTRUMENTS, self.lock, multiprocess)
        self._owns_provider = meter_provider is None
        self._closed = False
        # Through our cells where we build the provider and the SDK takes our View; else (the
        # caller's provider, or an SDK whose hook changed) every value goes through record().
        self.direct = meter_provider is not None or not sdk.bridge_works()
        if meter_provider is None:
            readers = [*metric_readers, *sdk.readers_from_environment()]
            views = () if self.direct else c.INSTRUMENTS
            meter_provider = sdk.build_provider(readers, self.table, self.lock, views)
        self.meter_provider = meter_provider
        # Each value also goes, one call at a time, to the SDK's instruments or to
        # prometheus_client's multiprocess files.
        self._record_each = self.direct or self.prometheus.multiprocess
        meter = sdk.get_meter(meter_provider)
        self.instruments = sdk.create_instruments(meter, c.INSTRUMENTS)
        if not self.direct:
            meter.create_observable_gauge(sdk.SYNC_INSTRUMENT, callbacks=[self._mark_all])
        self._bound: dict[BoundKey, _Bound] = {}
        for operation in sorted(set(operations)):  # born at zero: ok, per listed model
            for model in (None, *sorted(labels.allowed)):
                self._bind((operation, model, model, None))

    def observe(
        self, request: GenAIRequest, breakdown: Breakdown, input_tokens: int, output_tokens: int
    ) -> None:
        """Count one finished request (`output_tokens` 0 where it failed)."""
        key = (request.operation, request.request_label, request.response_label, request.error_type)
        bound = self._bound.get(key) or self._bind(key)
        ok = request.error_type is None
        ttft = breakdown.ttft_s if ok else None
        tpot = breakdown.tpot_s if ok else None
        with self.lock:
            bound.duration.add(breakdown.e2e_s)
            if ttft is not None:
                bound.ttft.add(ttft)
            if tpot is not None:
                bound.tpot.add(tpot)
            bound.input_tokens.add(input_tokens)
            bound.output_tokens.add(output_tokens)
            usage_in, usage_out = bound.usage  # counters: CounterCell.add, inlined
            usage_in.value += input_tokens
            usage_out.value += output_tokens
        # Never under our lock: the SDK's collection and prometheus_client take their own.
        if self._record_each:
            tokens = (input_tokens, output_tokens)
            values = (breakdown.e2e_s, ttft, tpot, *tokens, *tokens)
            if self.prometheus.multiprocess:
                self.prometheus.record(bound.in_order(), values)
            if self.direct:
                self._record(bound, values)

    def _record(self, bound: _Bound, values: tuple[Any, ...]) -> None:
        for cell, value in zip(bound.in_order(), values, strict=True):
            if cell is not None and value is not None:
                instrument = self.instruments[cell.instrument.name]
                if isinstance(cell, HistogramCell):
                    instrument.record(value, cell.attributes)
                else:
                    instrument.add(value, cell.attributes)

    def _bind(self, key: BoundKey) -> _Bound:
        operation, request_model, response_model, error_type = key
        base = {
            c.OPERATION: operation,
            c.PROVIDER: self.provider,
            c.REQUEST_MODEL: request_model,
            c.RESPONSE_MODEL: response_model,
        }
        made: dict[str, Cell] = {}
        new: list[Cell] = []
        with self.lock:
            for spec in c.INSTRUMENTS:
                if spec.records == "ok" and error_type is not None:
                    continue
                if spec.kind == "counter":
                    direction = "input" if spec is c.USAGE_INPUT_TOKENS else "output"
                    extra = {c.TOKEN_MODALITY: token_modality(operation, direction)}
                else:
                    extra = {c.ERROR_TYPE: error_type}
                cell, is_new = self.table.cell(spec, {**base, **extra})
                made[spec.name] = cell
                if is_new:
                    new.append(cell)
                    self.prometheus.add_cell(cell)
            bound = self._bound.setdefault(key, _Bound(made))
        for cell in new:
            self._mark(cell)
        return bound

    def _mark(self, cell: Cell) -> None:
        """Tell the SDK of an attribute set (a 0 its aggregation ignores); in direct mode the
        0 is a real, harmless value that makes the series exist from now on."""
        instrument = self.instruments[cell.instrument.name]
        if isinstance(cell, HistogramCell):
            if not self.direct:
                instrument.record(0, cell.attributes)
        else:
            instrument.add(0, cell.attributes)

    def _mark_all(self, options: CallbackOptions) -> Iterable[Observation]:
        """At every collection, before the SDK reads its aggregations: a delta reader dropped
        them after the last one."""
        for cell in list(self.table.cells.values()):
            self._mark(cell)
        return []

    def flush(self) -> None:
        """Nothing waits: `/metrics` reads the cells when collected (one process), or every
        value went to prometheus_client as it was recorded (multiprocess)."""

    def close(self) -> None:
        """Export what is left (OTLP) and stop the provider we made (once: the middleware's
        close runs at shutdown and again at exit)."""
        if self._owns_provider and not self._closed:
            self._closed = True
            self.meter_provider.shutdown()
