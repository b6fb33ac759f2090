"""The engine stand-ins' request spans: names, kinds and attributes as each engine sets them
(sources in tests/helpers/engine_standins.py), shipped through the real OpenTelemetry SDK and
its OTLP/HTTP exporter, with the faults a real deployment shows (late, twice, never, early).
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import random
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from google.protobuf import json_format
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

EXPORT_MODES = ("normal", "twice", "never", "early")
# protobuf, json: OTLP/HTTP; grpc: OTLP over gRPC, the SDK's gRPC exporter (vLLM's and
# SGLang's default protocol, TGI's only one), `url` then http://HOST:PORT.
ENCODINGS = ("protobuf", "json", "grpc")


@dataclass(frozen=True)
class Timeline:
    """One request's scripted schedule. The first token ends prefill; each later token takes
    `decode_s`. Spans carry these numbers, not measured ones, so a test compares exactly."""

    arrival_ns: int  # wall clock, as the engines stamp span start times
    queue_s: float
    prefill_s: float
    decode_s: float
    prompt_tokens: int
    completion_tokens: int

    @property
    def ttft_s(self) -> float:
        return self.queue_s + self.prefill_s

    @property
    def decode_total_s(self) -> float:
        return self.decode_s * (self.completion_tokens - 1)

    @property
    def e2e_s(self) -> float:
        return self.ttft_s + self.decode_total_s

    def at(self, seconds: float) -> int:
        """The wall-clock instant `seconds` after arrival, in ns."""
        return self.arrival_ns + round(seconds * 1e9)


@dataclass(frozen=True)
class Faults:
    mode: str = "normal"  # one of EXPORT_MODES
    max_delay_s: float = 0.0  # each export waits a random time in [0, max_delay_s]
    seed: int = 0


def rust_duration_debug(nanos: int) -> str:
    """`format!("{d:?}")` of a Rust `std::time::Duration`, as TGI records its span fields:
    "1.5s", "250ms", "12.5µs", "0ns" (the fraction is written out until it ends)."""
    secs, sub = divmod(nanos, 1_000_000_000)
    if secs:
        return _decimal(secs, sub, 100_000_000, "s")
    if sub >= 1_000_000:
        return _decimal(sub // 1_000_000, sub % 1_000_000, 100_000, "ms")
    if sub >= 1_000:
        return _decimal(sub // 1_000, sub % 1_000, 100, "µs")
    return f"{sub}ns"


def _decimal(integer: int, fraction: int, divisor: int, suffix: str) -> str:
    digits = ""
    while fraction and divisor:
        digits += str(fraction // divisor)
        fraction, divisor = fraction % divisor, divisor // 10
    return f"{integer}.{digits}{suffix}" if digits else f"{integer}{suffix}"


class OtlpJsonExporter(SpanExporter):
    """OTLP/HTTP with a JSON body. The SDK's exporter sends protobuf only (and vLLM, SGLang
    accept only `grpc` and `http/protobuf`), so this uses the SDK's own encoder and the OTLP
    JSON mapping: lowerCamelCase keys, enums as integers, trace and span ids as hex."""

    def __init__(self, endpoint: str, compression: str = "none") -> None:
        self.endpoint = endpoint
        self.compression = compression

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        document = json_format.MessageToDict(encode_spans(spans), use_integers_for_enums=True)
        for resource_spans in document.get("resourceSpans", []):
            for scope_spans in resource_spans.get("scopeSpans", []):
                for span in scope_spans.get("spans", []):
                    _ids_to_hex(span)
                    for link in span.get("links", []):
                        _ids_to_hex(link)
        body = json.dumps(document).encode()
        headers = {"content-type": "application/json"}
        if self.compression == "gzip":
            body, headers["content-encoding"] = gzip.compress(body), "gzip"
        try:
            response = httpx.post(self.endpoint, content=body, headers=headers, timeout=10)
        except httpx.HTTPError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS if response.is_success else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        pass


def _ids_to_hex(item: dict[str, Any]) -> None:
    for key in ("traceId", "spanId", "parentSpanId"):
        if key in item:
            item[key] = base64.b64decode(item[key]).hex()


class FaultyShipper(SpanProcessor):
    """Exports each ended span on its own, late, twice, never, or at once in the caller's
    thread ("early": the app ends the span before its last bytes, so it lands first)."""

    def __init__(self, exporter: SpanExporter, faults: Faults) -> None:
        self.exporter = exporter
        self.faults = faults
        self._random = random.Random(faults.seed)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        mode = self.faults.mode
        if mode == "never":
            return
        copies = 2 if mode == "twice" else 1
        if mode == "early":
            self._ship(span, copies, 0.0)
            return
        with self._lock:
            delay_s = self._random.uniform(0.0, self.faults.max_delay_s)
            thread = threading.Thread(target=self._ship, args=(span, copies, delay_s), daemon=True)
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _ship(self, span: ReadableSpan, copies: int, delay_s: float) -> None:
        time.sleep(delay_s)
        for _ in range(copies):
            self.exporter.export([span])

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in threads)

    def shutdown(self) -> None:
        self.force_flush()
        self.exporter.shutdown()


# Resource, instrumentation scope, span kind per engine (as their tracer setups make them).
_RESOURCES: dict[str, dict[str, str]] = {
    "vllm": {"vllm.instrumenting_module_name": "vllm.llm_engine", "vllm.process_id": ""},
    "sglang": {"service.name": "sglang"},
    "tgi": {"service.name": "text-generation-inference.router"},
}
_SCOPES = {"vllm": "vllm.tracing.otel", "sglang": "sglang server", "tgi": "text_generation_router"}


def make_tracer(
    engine: str, url: str, encoding: str, compression: str, faults: Faults
) -> tuple[Tracer, TracerProvider]:
    """A tracer whose spans go to `url` through the SDK, and its provider (not made global:
    shut it down to flush late exports)."""
    exporter: SpanExporter
    if encoding == "json":
        exporter = OtlpJsonExporter(url, compression)
    elif encoding == "grpc":
        exporter = _grpc_exporter(url, compression)
    else:
        exporter = OTLPSpanExporter(endpoint=url, compression=Compression(compression))
    attributes = dict(_RESOURCES[engine])
    if engine == "vllm":
        attributes["vllm.process_id"] = str(os.getpid())
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(FaultyShipper(exporter, faults))
    return provider.get_tracer(_SCOPES[engine]), provider


def _grpc_exporter(url: str, compression: str) -> SpanExporter:
    """The SDK's default OTLP exporter (opentelemetry-exporter-otlp-proto-grpc), as vLLM and
    SGLang build it from OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (the headers from the env too)."""
    from opentelemetry.exporter.otlp.proto.grpc import trace_exporter
    from opentelemetry.exporter.otlp.proto.grpc.exporter import Compression as GrpcCompression

    kind = {
        "none": GrpcCompression.NoCompression,
        "gzip": GrpcCompression.Gzip,
        "deflate": GrpcCompression.Deflate,
    }
    return trace_exporter.OTLPSpanExporter(
        endpoint=url, insecure=url.startswith("http://"), compression=kind[compression]
    )


def parent_context(engine: str, headers: Mapping[str, str]) -> Context:
    """The incoming W3C context. vLLM and SGLang forward `traceparent` and `tracestate`; TGI
    parses `traceparent` alone."""
    names = ("traceparent",) if engine == "tgi" else ("traceparent", "tracestate")
    carrier = {name: headers[name] for name in names if name in headers}
    return TraceContextTextMapPropagator().extract(carrier)


@dataclass(frozen=True)
class RequestFacts:
    """What a request span says besides its timeline."""

    route: str  # "chat" or "completions"
    request_id: str  # vLLM: external request id; SGLang: rid; TGI: none ("")
    model: str
    finish_reason: str
    sampling: Mapping[str, Any]  # max_tokens, temperature, top_p, top_k, n, seed as sent


def start_request_span(
    tracer: Tracer, engine: str, parent: Context, timeline: Timeline, facts: RequestFacts
) -> Span:
    """The engine's request span, started at arrival with its final attributes (the app ends
    it where the engine does). SGLang's sibling spans are written here too."""
    if engine == "vllm":
        name, kind, attributes = "llm_request", SpanKind.SERVER, vllm_attributes(timeline, facts)
    elif engine == "sglang":
        name, kind = f" Req {facts.request_id[:8]}", SpanKind.INTERNAL
        attributes = sglang_attributes(timeline, facts)
    else:
        name, kind = (
            "chat_completions" if facts.route == "chat" else "completions",
            SpanKind.INTERNAL,
        )
        attributes = tgi_attributes(timeline, facts)
    span: Span = tracer.start_span(  # type: ignore[assignment]
        name, context=parent, kind=kind, start_time=timeline.arrival_ns, attributes=attributes
    )
    if engine == "sglang":
        _sglang_scheduler_spans(tracer, set_span_in_context(span), timeline)
    return span


def vllm_attributes(t: Timeline, facts: RequestFacts) -> dict[str, Any]:
    """vllm/v1/engine/output_processor.py `do_tracing`: seconds as floats."""
    attributes: dict[str, Any] = {
        "gen_ai.latency.time_to_first_token": t.ttft_s,
        "gen_ai.latency.e2e": t.e2e_s,
        "gen_ai.latency.time_in_queue": t.queue_s,
        "gen_ai.usage.prompt_tokens": t.prompt_tokens,
        "gen_ai.usage.completion_tokens": t.completion_tokens,
        "gen_ai.latency.time_in_model_prefill": t.prefill_s,
        "gen_ai.latency.time_in_model_decode": t.decode_total_s,
        "gen_ai.latency.time_in_model_inference": t.prefill_s + t.decode_total_s,
        "gen_ai.request.id": facts.request_id,
        "gen_ai.response.finish_reasons": json.dumps([facts.finish_reason]),
    }
    for key in ("top_p", "max_tokens", "temperature", "n"):
        if facts.sampling.get(key):
            attributes[f"gen_ai.request.{key}"] = facts.sampling[key]
    return attributes


def sglang_attributes(t: Timeline, facts: RequestFacts) -> dict[str, Any]:
    """SGLang's root span: `rid`, `module` at start; usage, request and latency attributes at
    finish. Its "prefill" runs from dispatch (here: arrival) to the first token, so it holds
    the scheduler's queue wait; it sets no `time_in_queue`."""
    attributes: dict[str, Any] = {
        "rid": facts.request_id,
        "module": "sglang::request",
        "gen_ai.usage.completion_tokens": t.completion_tokens,
        "gen_ai.usage.prompt_tokens": t.prompt_tokens,
        "gen_ai.usage.cached_tokens": 0,
        "gen_ai.request.id": facts.request_id,
        "gen_ai.response.model": facts.model,
        "gen_ai.response.finish_reasons": json.dumps([facts.finish_reason]),
        "gen_ai.latency.time_to_first_token": t.ttft_s,
        "gen_ai.latency.e2e": t.e2e_s,
        "gen_ai.latency.time_in_model_decode": t.decode_total_s,
        "gen_ai.latency.time_in_model_inference": t.e2e_s,
        "gen_ai.latency.time_in_model_prefill": t.ttft_s,
    }
    for key in ("max_tokens", "top_p", "temperature", "top_k", "n"):
        if facts.sampling.get(key):
            attributes[f"gen_ai.request.{key}"] = facts.sampling[key]
    return attributes


def _sglang_scheduler_spans(tracer: Tracer, root: Context, t: Timeline) -> None:
    thread = tracer.start_span(
        f"Scheduler [TP 0] (host:standin0 | pid:{os.getpid()})",
        context=root,
        start_time=t.arrival_ns,
        attributes={"thread_label": "Scheduler", "tp_rank": 0, "pid": os.getpid()},
    )
    slices = (
        ("prefill_waiting", 0.0, t.queue_s),
        ("prefill_forward", t.queue_s, t.ttft_s),
        ("decode_loop", t.ttft_s, t.e2e_s),
    )
    for name, begin_s, end_s in slices:
        tracer.start_span(name, context=set_span_in_context(thread), start_time=t.at(begin_s)).end(
            end_time=t.at(end_s)
        )
    thread.end(end_time=t.at(t.e2e_s))


def tgi_attributes(t: Timeline, facts: RequestFacts) -> dict[str, Any]:
    """router/src/server.rs: the handler span's fields, recorded as `format!("{d:?}")`
    strings. Validation is scripted as 0; `time_per_token` is inference / generated tokens
    (a Rust `Duration / u32`: whole nanoseconds, rounded down)."""
    queue_ns, validation_ns = round(t.queue_s * 1e9), 0
    inference_ns = round((t.prefill_s + t.decode_total_s) * 1e9)
    seed = facts.sampling.get("seed")
    return {
        "total_time": rust_duration_debug(validation_ns + queue_ns + inference_ns),
        "validation_time": rust_duration_debug(validation_ns),
        "queue_time": rust_duration_debug(queue_ns),
        "inference_time": rust_duration_debug(inference_ns),
        "time_per_token": rust_duration_debug(inference_ns // t.completion_tokens),
        "seed": "None" if seed is None else f"Some({seed})",
    }
