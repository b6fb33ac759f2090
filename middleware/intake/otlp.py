"""Decode an OTLP/HTTP trace export into the engine request spans it holds.

OTLP/HTTP (opentelemetry-proto's `ExportTraceServiceRequest`) comes as protobuf
(`application/x-protobuf`) or as JSON (`application/json`: the protobuf JSON mapping, except
that trace and span ids are hex strings and enums are integers), each compressed or not
(`Content-Encoding: gzip`, or `deflate` as the SDK's exporter can send). Only spans an adapter
claims by name are read, and of those only the attributes their adapter reads; an engine's
stage spans (`EngineAdapter.stage_spans`, children of its request spans) are read for their
trace id and duration alone; the rest of the export (the engine's other spans and attributes,
resources, events) is skipped.

An engine exports thousands of request spans a second (vLLM: one per request, 512 per
export), and the proxy decodes them on the event loop that streams its responses, so the
protobuf path reads each span's attributes through a lean schema of its own
(`_lean_export_class`): the same wire format with `attributes` as a map, so the wanted keys
are looked up in C instead of every KeyValue being walked in Python.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from typing import Any

from middleware.upstream import EngineAdapter, SpanPhases, adapter_for_span, adapter_for_stage

# An export larger than this once decompressed is refused (a batch of 512 engine spans with
# their attributes is well under 1 MiB).
MAX_EXPORT_BYTES = 16 << 20


class IntakeError(ValueError):
    """A body `POST /v1/traces` cannot read: the message says what and how to fix it."""


def _inflate(body: bytes, encoding: str) -> bytes:
    # wbits: 31 reads a gzip stream, 15 a zlib one (the SDK exporter's "deflate").
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        data = inflater.decompress(body, MAX_EXPORT_BYTES)
    except zlib.error as error:
        raise IntakeError(
            f"body is not {encoding} ({error}); send it uncompressed or drop Content-Encoding"
        ) from error
    if inflater.unconsumed_tail:
        raise IntakeError(
            f"decompressed export exceeds {MAX_EXPORT_BYTES} bytes; send smaller batches"
        )
    return data


# Whether a span under (trace id, request id) is worth reading (`SpanJoin.wanted`).
Wanted = Callable[[str, Any], bool]


def decode_export(
    body: bytes, content_type: str, content_encoding: str = "", wanted: Wanted | None = None
) -> list[SpanPhases]:
    """The engine request spans of one export, read by their adapters."""
    encoding = content_encoding.strip().lower()
    if encoding in ("gzip", "deflate"):
        body = _inflate(body, encoding)
    elif encoding not in ("", "identity"):
        raise IntakeError(
            f"Content-Encoding {content_encoding!r} is not supported; use gzip, deflate or none"
        )
    if len(body) > MAX_EXPORT_BYTES:
        raise IntakeError(f"export exceeds {MAX_EXPORT_BYTES} bytes; send smaller batches")
    kind = content_type.split(";")[0].strip().lower()
    if kind == "application/x-protobuf":
        spans = _protobuf_spans(body, wanted)
    elif kind == "application/json":
        spans = _json_spans(body, wanted)
    else:
        raise IntakeError(
            f"Content-Type {content_type!r} is not OTLP; use application/x-protobuf or "
            "application/json (OTLP/HTTP)"
        )
    read: list[SpanPhases] = []
    for adapter, trace_id, attributes in spans:
        if isinstance(attributes, float):  # a stage span: its name and seconds
            read.append(_stage(adapter, trace_id, attributes))
            continue
        phases = adapter.phases(trace_id, attributes)
        if phases is not None:
            read.append(phases)
    return read


# The span readers yield (adapter, trace id, the attributes it reads) for a request span, and
# ((adapter, stage name), trace id, seconds) for a stage span.


def _stage(claimed: Any, trace_id: str, seconds: float) -> SpanPhases:
    adapter, name = claimed
    return SpanPhases(trace_id=trace_id, engine=adapter.name, stage=name, stage_s=seconds)


def _seconds(start_ns: int, end_ns: int) -> float:
    return (end_ns - start_ns) / 1e9 if end_ns > start_ns > 0 else 0.0


class _Claims:
    """Which adapter claims a span name and which attributes it reads, looked up once per name
    in one export (an export repeats a few names: vLLM's are all `llm_request`)."""

    def __init__(self) -> None:
        self._adapters: dict[str, EngineAdapter | None] = {}
        self._keys: dict[str, frozenset[str] | None] = {}

    def adapter(self, name: str) -> EngineAdapter | None:
        try:
            return self._adapters[name]
        except KeyError:
            adapter = self._adapters[name] = adapter_for_span(name)
            return adapter

    def stage(self, name: str) -> EngineAdapter | None:
        """The adapter whose engine names a stage span `name` (looked up once per name)."""
        key = "\0" + name
        try:
            return self._adapters[key]
        except KeyError:
            adapter = self._adapters[key] = adapter_for_stage(name)
            return adapter

    def keys(self, adapter: EngineAdapter) -> frozenset[str] | None:
        """The attribute keys `adapter` reads; None when it reads the span itself (all)."""
        try:
            return self._keys[adapter.name]
        except KeyError:
            keys = None if adapter.read_span else frozenset(adapter.span_attributes.values())
            self._keys[adapter.name] = keys
            return keys


def _protobuf_spans(body: bytes, wanted: Wanted | None) -> Iterator[Any]:
    from google.protobuf.message import DecodeError

    try:
        request = _lean_export_class().FromString(body)
    except DecodeError as error:
        raise IntakeError(
            f"body is not an OTLP protobuf ExportTraceServiceRequest: {error}"
        ) from error
    claims = _Claims()
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                adapter = claims.adapter(span.name)
                if adapter is None:
                    stage = claims.stage(span.name) if span.name else None
                    if stage is not None:
                        trace_id = span.trace_id.hex()
                        if wanted is None or wanted(trace_id, None):
                            start, end = span.start_time_unix_nano, span.end_time_unix_nano
                            yield (stage, span.name), trace_id, _seconds(start, end)
                    continue
                keys, held = claims.keys(adapter), span.attributes
                trace_id = span.trace_id.hex()
                if wanted is not None:
                    id_key = adapter.span_attributes.get("request_id")
                    request_id = _proto_value(held[id_key]) if id_key in held else None
                    if not wanted(trace_id, request_id):
                        continue  # no request of ours: its attributes are never read
                if keys is None:
                    attributes = {key: _proto_value(value) for key, value in held.items()}
                else:
                    attributes = {key: _proto_value(held[key]) for key in keys if key in held}
                yield adapter, trace_id, attributes


@cache
def _lean_export_class() -> Any:
    """`ExportTraceServiceRequest` cut down to what the intake reads: resource_spans (1) >
    scope_spans (2) > spans (2) > trace_id (1), name (5), start and end (7, 8: a stage span's
    duration) and attributes (9), the attributes as `map<string, AnyValue>`. A map is encoded
    exactly as a repeated KeyValue {key = 1, value = 2}, so it reads the same bytes; every other
    field is skipped by the parser. Built in a pool of its own from opentelemetry-proto's
    AnyValue."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from opentelemetry.proto.common.v1 import common_pb2

    common = descriptor_pb2.FileDescriptorProto()
    common_pb2.DESCRIPTOR.CopyToProto(common)
    lean = descriptor_pb2.FileDescriptorProto(
        name="llm_slo/lean_trace.proto",
        package="llm_slo.lean",
        syntax="proto3",
        dependency=[common.name],
    )
    field = descriptor_pb2.FieldDescriptorProto
    repeated, optional = field.LABEL_REPEATED, field.LABEL_OPTIONAL
    span = lean.message_type.add(name="Span")
    entry = span.nested_type.add(name="AttributesEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=field.TYPE_STRING, label=optional)
    entry.field.add(
        name="value",
        number=2,
        type=field.TYPE_MESSAGE,
        label=optional,
        type_name=".opentelemetry.proto.common.v1.AnyValue",
    )
    span.field.add(name="trace_id", number=1, type=field.TYPE_BYTES, label=optional)
    span.field.add(name="name", number=5, type=field.TYPE_STRING, label=optional)
    for name, number in (("start_time_unix_nano", 7), ("end_time_unix_nano", 8)):
        span.field.add(name=name, number=number, type=field.TYPE_FIXED64, label=optional)
    span.field.add(
        name="attributes",
        number=9,
        type=field.TYPE_MESSAGE,
        label=repeated,
        type_name=".llm_slo.lean.Span.AttributesEntry",
    )
    for name, child, number, child_type in (
        ("ScopeSpans", "spans", 2, "Span"),
        ("ResourceSpans", "scope_spans", 2, "ScopeSpans"),
        ("Export", "resource_spans", 1, "ResourceSpans"),
    ):
        holder = lean.message_type.add(name=name)
        holder.field.add(
            name=child,
            number=number,
            type=field.TYPE_MESSAGE,
            label=repeated,
            type_name=f".llm_slo.lean.{child_type}",
        )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(common)
    pool.Add(lean)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("llm_slo.lean.Export"))


def _proto_value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_proto_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return {item.key: _proto_value(item.value) for item in value.kvlist_value.values}
    return getattr(value, kind)


def _json_spans(body: bytes, wanted: Wanted | None) -> Iterator[Any]:
    try:
        request = json.loads(body)
    except ValueError as error:
        raise IntakeError(f"body is not JSON: {error}") from error
    if not isinstance(request, dict):
        raise IntakeError("OTLP JSON export must be an object with resourceSpans")
    claims = _Claims()
    for resource_spans in _list(request, "resourceSpans"):
        scopes = _list(resource_spans, "scopeSpans") or _list(
            resource_spans, "instrumentationLibrarySpans"
        )
        for scope_spans in scopes:
            for span in _list(scope_spans, "spans"):
                name = span.get("name")
                adapter = claims.adapter(name) if isinstance(name, str) else None
                if adapter is None:
                    stage = claims.stage(name) if isinstance(name, str) else None
                    if stage is not None:
                        yield from _json_stage(stage, name, span, wanted)
                    continue
                trace_id = _json_trace_id(span.get("traceId"))
                attributes = {
                    item.get("key"): _json_value(item.get("value"))
                    for item in _list(span, "attributes")
                }
                request_id = attributes.get(adapter.span_attributes.get("request_id", ""))
                if wanted is not None and not wanted(trace_id, request_id):
                    continue
                yield adapter, trace_id, attributes


def _json_stage(
    adapter: EngineAdapter, name: str, span: Mapping[str, Any], wanted: Wanted | None
) -> Iterator[Any]:
    trace_id = _json_trace_id(span.get("traceId"))
    if wanted is None or wanted(trace_id, None):
        times = [
            _json_value({"intValue": span.get(k)}) for k in ("startTimeUnixNano", "endTimeUnixNano")
        ]
        start, end = (t if isinstance(t, int) else 0 for t in times)
        yield (adapter, name), trace_id, _seconds(start, end)


def _list(holder: Any, key: str) -> list[Any]:
    value = holder.get(key) if isinstance(holder, Mapping) else None
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise IntakeError(f"OTLP JSON field {key!r} must be a list of objects")
    return value


def _json_trace_id(value: Any) -> str:
    if isinstance(value, str):
        if len(value) == 32:
            try:
                int(value, 16)
                return value.lower()
            except ValueError:
                pass
        try:  # the plain protobuf JSON mapping writes bytes as base64
            raw = base64.b64decode(value, validate=True)
            if len(raw) == 16:
                return raw.hex()
        except ValueError:
            pass
    raise IntakeError(f"span traceId {value!r} is not 32 hex digits")


def _json_value(value: Any) -> Any:
    if not isinstance(value, Mapping) or not value:
        return None
    kind, inner = next(iter(value.items()))
    if kind == "intValue":  # int64 is a JSON string in the protobuf mapping
        try:
            return int(inner)
        except (TypeError, ValueError):
            return None
    if kind == "doubleValue":
        return float(inner) if isinstance(inner, int | float | str) else None
    if kind == "arrayValue":
        return [_json_value(item) for item in (inner or {}).get("values", [])]
    if kind == "kvlistValue":
        return {
            item.get("key"): _json_value(item.get("value"))
            for item in (inner or {}).get("values", [])
        }
    return inner
