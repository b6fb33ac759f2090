"""One registry of upstream engines: what each puts on the wire and beside it.

Each engine's module declares one `EngineAdapter`: the response headers and body keys it reads
(and the functions that read them),
the names of its request spans (OTLP, `POST /v1/traces`) and which span attributes hold its
phases and counts, and which of its Prometheus `/metrics` families map onto the engine gauges
the bundled engine fills. Adding an engine is one module that calls `register` and its test.

Nothing here runs per usual chunk: the exchange looks response headers up in `RESPONSE_HEADERS`,
and the wire decodes `BODY_KEYS` beside the OpenAI fields (`middleware.wire.chunk`, rebuilt when
an adapter brings a new key), so a chunk carries an engine's report only where it says so.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from middleware.upstream.report import UpstreamReport

# What an engine span can tell about one request (`SpanPhases` fields) and the engine gauges a
# `/metrics` family can feed (`slo.sli` catalog names of the engine gauges and counters).
SPAN_FIELDS = ("queue_s", "prefill_s", "decode_s", "input_tokens", "output_tokens", "request_id")
ENGINE_METRIC_TARGETS = ("queue_depth", "running", "batch_size", "kv_usage", "preemptions")
# The OpenAI fields of a chunk or body that the wire reads itself: no engine's body key.
OPENAI_BODY_FIELDS = ("choices", "usage", "error", "id", "model", "object", "created")


@dataclass(frozen=True, slots=True)
class SpanPhases:
    """One engine request span, read: seconds and counts, None where the span did not say."""

    trace_id: str
    request_id: str | None = None
    queue_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    engine: str = ""
    # A stage span (a child of the request span, in the same trace): its name and seconds. The
    # join sums an engine's stage spans by name and lets `read_stages` make phases of them.
    stage: str | None = None
    stage_s: float | None = None


def _seconds(value: Any, scale: float) -> float | None:
    if type(value) in (int, float) and 0 <= value < float("inf"):
        return float(value) * scale
    return None


def _count(value: Any) -> int | None:
    if type(value) is int and value >= 0:
        return value
    if type(value) is float and value.is_integer() and value >= 0:
        return int(value)
    return None


@dataclass(frozen=True)
class EngineAdapter:
    """What one engine reports, by name.

    `headers` are the response headers the engine tells a request's phases or counts in, and
    `read_headers(report, found)` takes them into the request's `UpstreamReport` (`found`: the
    headers of `headers` the response carried, by lower-case name; True when it took any).
    `body_keys` are the top-level keys of a response body or stream chunk the engine reports in,
    beside the OpenAI fields, and `read_body(report, found)` takes them (`found`: the keys of
    `body_keys` the chunk carried, not null, with their decoded JSON values; True when it took
    any).
    `span_attributes` maps a `SPAN_FIELDS` name to the engine's span attribute; latencies are
    in units of `span_unit_s` seconds. `read_span` overrides the attribute map for an engine
    whose spans need more than a lookup. `metrics` maps a `/metrics` family name (as
    prometheus_client's parser names it) to one of `ENGINE_METRIC_TARGETS`.
    """

    name: str
    headers: frozenset[bytes] = frozenset()
    read_headers: Callable[[UpstreamReport, Mapping[bytes, bytes]], bool] | None = None
    body_keys: tuple[str, ...] = ()
    read_body: Callable[[UpstreamReport, Mapping[str, Any]], bool] | None = None
    span_names: frozenset[str] = frozenset()
    # For an engine whose request span names carry the request (SGLang's " Req 1a2b3c4d").
    span_name_pattern: re.Pattern[str] | None = None
    span_attributes: Mapping[str, str] = field(default_factory=dict)
    span_unit_s: float = 1.0
    read_span: Callable[[str, Mapping[str, Any]], SpanPhases | None] | None = None
    # For an engine that times its stages in child spans of the request span (SGLang's
    # `prefill_waiting`, `prefill_forward`, `decode_loop`): their names, and the function that
    # makes `queue_s` / `prefill_s` / `decode_s` of their seconds summed by name.
    stage_spans: frozenset[str] = frozenset()
    read_stages: Callable[[Mapping[str, float]], Mapping[str, float]] | None = None
    metrics: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if bool(self.headers) != (self.read_headers is not None):
            raise ValueError(
                f"engine adapter {self.name!r}: `headers` and `read_headers` come together "
                "(the headers it reads, and the function that reads them)"
            )
        if any(name != name.lower() for name in self.headers):
            raise ValueError(f"engine adapter {self.name!r}: name `headers` in lower case")
        self._check_body_keys()
        if bool(self.stage_spans) != (self.read_stages is not None):
            raise ValueError(
                f"engine adapter {self.name!r}: `stage_spans` and `read_stages` come together "
                "(the stage spans it reads, and the function that makes phases of them)"
            )
        unknown = set(self.span_attributes) - set(SPAN_FIELDS)
        if unknown:
            raise ValueError(
                f"engine adapter {self.name!r}: span_attributes names {sorted(unknown)}; "
                f"use fields of {SPAN_FIELDS}"
            )
        targets = set(self.metrics.values()) - set(ENGINE_METRIC_TARGETS)
        if targets:
            raise ValueError(
                f"engine adapter {self.name!r}: metrics map onto {sorted(targets)}; "
                f"use one of {ENGINE_METRIC_TARGETS}"
            )

    def _check_body_keys(self) -> None:
        if bool(self.body_keys) != (self.read_body is not None):
            raise ValueError(
                f"engine adapter {self.name!r}: `body_keys` and `read_body` come together "
                "(the keys it reads, and the function that reads them)"
            )
        taken = set(self.body_keys) & set(OPENAI_BODY_FIELDS)
        if taken:
            raise ValueError(
                f"engine adapter {self.name!r}: body_keys {sorted(taken)} are OpenAI fields the "
                "wire reads itself; name the engine's own keys"
            )

    def phases(self, trace_id: str, attributes: Mapping[str, Any]) -> SpanPhases | None:
        """The phases and counts a request span of this engine carries."""
        if self.read_span is not None:
            return self.read_span(trace_id, attributes)
        names = self.span_attributes
        values: dict[str, Any] = {}
        for name in ("queue_s", "prefill_s", "decode_s"):
            if name in names:
                values[name] = _seconds(attributes.get(names[name]), self.span_unit_s)
        for name in ("input_tokens", "output_tokens"):
            if name in names:
                values[name] = _count(attributes.get(names[name]))
        if "request_id" in names:
            request_id = attributes.get(names["request_id"])
            values["request_id"] = request_id if isinstance(request_id, str) else None
        return SpanPhases(trace_id=trace_id, engine=self.name, **values)


ADAPTERS: dict[str, EngineAdapter] = {}
# Every response header some adapter reads (lower case), kept up to date by `register`: the
# exchange looks each response header up here, so an adapter registered later is read too.
RESPONSE_HEADERS: set[bytes] = set()
# Every body key some adapter reads, in the order they came: the wire decodes these beside the
# OpenAI fields. `register` tells each of `BODY_KEYS_LISTENERS` when a new key comes.
BODY_KEYS: list[str] = []
BODY_KEYS_LISTENERS: list[Callable[[], None]] = []


def register(adapter: EngineAdapter) -> EngineAdapter:
    """Add one engine's adapter; its name and span names must be new."""
    if adapter.name in ADAPTERS:
        raise ValueError(f"engine adapter {adapter.name!r} is registered twice")
    for other in ADAPTERS.values():
        shared = adapter.span_names & other.span_names
        if shared:
            raise ValueError(
                f"engine adapters {other.name!r} and {adapter.name!r} both claim spans "
                f"named {sorted(shared)}; a span name must say which engine sent it"
            )
    for other in ADAPTERS.values():
        shared_keys = set(adapter.body_keys) & set(other.body_keys)
        if shared_keys:
            raise ValueError(
                f"engine adapters {other.name!r} and {adapter.name!r} both read the body keys "
                f"{sorted(shared_keys)}; a body key must say which engine sent it"
            )
        shared_stages = adapter.stage_spans & other.stage_spans
        if shared_stages:
            raise ValueError(
                f"engine adapters {other.name!r} and {adapter.name!r} both claim stage spans "
                f"named {sorted(shared_stages)}; a stage span name must say which engine sent it"
            )
    ADAPTERS[adapter.name] = adapter
    RESPONSE_HEADERS.update(adapter.headers)
    if adapter.body_keys:
        BODY_KEYS.extend(adapter.body_keys)
        for listener in BODY_KEYS_LISTENERS:
            listener()
    return adapter


def adapter_for_span(name: str) -> EngineAdapter | None:
    """The adapter whose engine names its request spans `name`, if any."""
    for adapter in ADAPTERS.values():
        if name in adapter.span_names:
            return adapter
        pattern = adapter.span_name_pattern
        if pattern is not None and pattern.fullmatch(name):
            return adapter
    return None


def adapter_for_stage(name: str) -> EngineAdapter | None:
    """The adapter whose engine names a stage span `name`, if any."""
    for adapter in ADAPTERS.values():
        if name in adapter.stage_spans:
            return adapter
    return None


def with_stages(span: SpanPhases, stages: Mapping[str, float]) -> SpanPhases:
    """A request span with the phases its engine's stage spans give (seconds by stage name);
    a phase the stages give replaces the request span's own."""
    adapter = ADAPTERS.get(span.engine)
    if adapter is None or adapter.read_stages is None or not stages:
        return span
    phases: dict[str, Any] = {k: v for k, v in adapter.read_stages(stages).items() if k in _PHASES}
    return dataclasses.replace(span, **phases) if phases else span


_PHASES = ("queue_s", "prefill_s", "decode_s")


def read_response_headers(report: UpstreamReport, found: Mapping[bytes, bytes]) -> bool:
    """Each adapter whose headers the response carried reads them into `report`; True when
    one took something."""
    took = False
    for adapter in ADAPTERS.values():
        if adapter.read_headers is not None and not adapter.headers.isdisjoint(found):
            took = adapter.read_headers(report, found) or took
    return took


def read_response_body(report: UpstreamReport, found: Mapping[str, Any]) -> bool:
    """Each adapter whose body keys a chunk or body carried (`found`: key to value, not null)
    reads them into `report`; True when one took something."""
    took = False
    for adapter in ADAPTERS.values():
        if adapter.read_body is not None and not found.keys().isdisjoint(adapter.body_keys):
            took = adapter.read_body(report, found) or took
    return took
