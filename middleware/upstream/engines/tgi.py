"""Hugging Face TGI: timing headers of non-streamed responses (router/src/server.rs).

`x-queue-time`, `x-inference-time`, `x-validation-time` and `x-time-per-token` are whole
milliseconds; `x-generated-tokens` and `x-prompt-tokens` are counts. A stream's headers leave
before any of these are known, so streams carry none.

TGI computes `x-time-per-token` as inference time / generated tokens, so prefill and decode are
estimated from it: decode = time per token x (generated - 1), prefill = the rest of inference.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from middleware.upstream.registry import EngineAdapter, SpanPhases, register
from middleware.upstream.report import UpstreamReport

# The response headers read here (lower case), declared once for the middleware.
HEADERS = frozenset(
    (
        b"x-queue-time",
        b"x-inference-time",
        b"x-time-per-token",
        b"x-generated-tokens",
        b"x-prompt-tokens",
        b"x-validation-time",
    )
)


def _int_header(headers: Mapping[bytes, bytes], name: bytes) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        return None
    return number if number >= 0 else None


def apply_tgi_headers(report: UpstreamReport, headers: Mapping[bytes, bytes]) -> bool:
    """Take TGI's phases from response headers (lower-case names); False when there are none."""
    inference_ms = _int_header(headers, b"x-inference-time")
    queue_ms = _int_header(headers, b"x-queue-time")
    if inference_ms is None and queue_ms is None:
        return False
    if queue_ms is not None:
        report.queue_s = queue_ms / 1000
    generated = _int_header(headers, b"x-generated-tokens")
    if generated is not None and report.tokens_source != "usage":
        report.output_tokens = generated
        report.tokens_source = "usage"
    prompt = _int_header(headers, b"x-prompt-tokens")
    if prompt is not None and report.input_tokens is None:
        report.input_tokens = prompt
    if inference_ms is not None:
        per_token_ms = _int_header(headers, b"x-time-per-token")
        decode_ms = 0
        if per_token_ms is not None and generated:
            decode_ms = min(per_token_ms * (generated - 1), inference_ms)
        report.decode_s = decode_ms / 1000
        report.prefill_s = (inference_ms - decode_ms) / 1000
    return True


# Its handler spans (router/src/server.rs `#[instrument(fields(...))]`, exported over OTLP with
# `--otlp-endpoint`, gRPC only: put an OpenTelemetry Collector in front of `POST /v1/traces`)
# are children of the request's traceparent and record `queue_time`, `inference_time`,
# `time_per_token`, ... as Rust `Duration` debug strings ("1.234567ms", "2.5s", "850µs").
SPAN_NAMES = frozenset({"generate", "generate_stream", "chat_completions", "completions"})
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ns|µs|us|ms|s)\s*")
_UNIT_S = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def rust_duration_s(value: Any) -> float | None:
    """Seconds of a Rust `Duration` debug string, None for anything else."""
    if not isinstance(value, str):
        return None
    match = _DURATION.fullmatch(value)
    if match is None:
        return None
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def read_tgi_span(trace_id: str, attributes: Any) -> SpanPhases:
    """TGI tells its queue (batch start - queued) and its inference; inference splits into
    prefill and decode only by its own per-token average, so the span gives the queue, and the
    time from it to the first token on the wire is prefill (validation included)."""
    return SpanPhases(
        trace_id=trace_id, queue_s=rust_duration_s(attributes.get("queue_time")), engine="tgi"
    )


TGI = register(
    EngineAdapter(
        name="tgi",
        headers=HEADERS,
        read_headers=apply_tgi_headers,
        span_names=SPAN_NAMES,
        read_span=read_tgi_span,
        metrics={
            "tgi_queue_size": "queue_depth",
            "tgi_batch_current_size": "batch_size",
        },
    )
)
