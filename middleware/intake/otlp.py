"""Decode an OTLP/HTTP trace export into the engine request spans it holds.

OTLP/HTTP (opentelemetry-proto's `ExportTraceServiceRequest`) comes as protobuf
(`application/x-protobuf`) or as JSON (`application/json`: the protobuf JSON mapping, except
that trace and span ids are hex strings and enums are integers), each compressed or not
(`Content-Encoding: gzip`, or `deflate` as the SDK's exporter can send). Only spans an adapter claims by name are read; the rest of the
export (the engine's other spans, resources, events) is skipped.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

from middleware.upstream import SpanPhases, adapter_for_span

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


def decode_export(body: bytes, content_type: str, content_encoding: str = "") -> list[SpanPhases]:
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
        spans = _protobuf_spans(body)
    elif kind == "application/json":
        spans = _json_spans(body)
    else:
        raise IntakeError(
            f"Content-Type {content_type!r} is not OTLP; use application/x-protobuf or "
            "application/json (OTLP/HTTP)"
        )
    read: list[SpanPhases] = []
    for name, trace_id, attributes in spans:
        adapter = adapter_for_span(name)
        if adapter is None:
            continue
        phases = adapter.phases(trace_id, attributes)
        if phases is not None:
            read.append(phases)
    return read


def _protobuf_spans(body: bytes) -> Iterator[tuple[str, str, dict[str, Any]]]:
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    try:
        request = ExportTraceServiceRequest.FromString(body)
    except DecodeError as error:
        raise IntakeError(
            f"body is not an OTLP protobuf ExportTraceServiceRequest: {error}"
        ) from error
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                if adapter_for_span(span.name) is None:
                    continue
                attributes = {item.key: _proto_value(item.value) for item in span.attributes}
                yield span.name, span.trace_id.hex(), attributes


def _proto_value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_proto_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return {item.key: _proto_value(item.value) for item in value.kvlist_value.values}
    return getattr(value, kind)


def _json_spans(body: bytes) -> Iterator[tuple[str, str, dict[str, Any]]]:
    try:
        request = json.loads(body)
    except ValueError as error:
        raise IntakeError(f"body is not JSON: {error}") from error
    if not isinstance(request, dict):
        raise IntakeError("OTLP JSON export must be an object with resourceSpans")
    for resource_spans in _list(request, "resourceSpans"):
        scopes = _list(resource_spans, "scopeSpans") or _list(
            resource_spans, "instrumentationLibrarySpans"
        )
        for scope_spans in scopes:
            for span in _list(scope_spans, "spans"):
                name = span.get("name")
                if not isinstance(name, str) or adapter_for_span(name) is None:
                    continue
                attributes = {
                    item.get("key"): _json_value(item.get("value"))
                    for item in _list(span, "attributes")
                }
                yield name, _json_trace_id(span.get("traceId")), attributes


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
