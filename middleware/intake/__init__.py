"""Engine spans in: OTLP/HTTP traces at `POST /v1/traces`, joined to the wire records.

- `otlp`: decodes an export request (protobuf or JSON, gzip or not) into engine request
  spans, read by the adapter whose engine names them (`middleware.upstream`);
- `join`: holds each finished request's report a bounded time for its engine span, so the
  record, the histograms and the live windows take the engine's queue, prefill and decode,
  exactly once, with or without the span;
- `endpoint`: the ASGI endpoint.
"""

from middleware.intake.apply import apply_engine_span
from middleware.intake.endpoint import serve_traces
from middleware.intake.join import JoinCounts, SpanJoin
from middleware.intake.otlp import IntakeError, decode_export

__all__ = [
    "IntakeError",
    "JoinCounts",
    "SpanJoin",
    "apply_engine_span",
    "decode_export",
    "serve_traces",
]
