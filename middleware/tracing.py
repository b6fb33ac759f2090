"""OpenTelemetry: one SERVER span per request with a child span per phase at its real times,
and the request's GenAI-convention view (`middleware.otel`) that names the span and feeds the
`gen_ai.*` metrics.

Spans are off unless a tracer provider with an SDK is configured, either passed in or built
from the standard `OTEL_*` variables (`OTEL_TRACES_EXPORTER=console|otlp`, `OTEL_SERVICE_NAME`,
...). Off means no span objects at all. Spans are made when the request ends, from the
timeline, with explicit start and end times, so the hot path never touches the tracer.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context

from middleware.intake.propagate import HandedIds
from middleware.otel.conventions import FALLBACK_PROVIDER, SCHEMA_URL
from middleware.otel.metrics import GenAIMetrics
from middleware.otel.models import ModelLabels
from middleware.otel.request import GenAIRequest, read_request_body
from middleware.request.exchange import Exchange
from middleware.request.timeline import Breakdown, RequestTimeline

logger = logging.getLogger("middleware.tracing")

# Sized for a streaming load: the SDK's default of 2048 drops spans under a burst of requests,
# each bringing 7 spans. Dropped spans are counted, never silent.
SPAN_QUEUE_SIZE = 65536


class DropCounter:
    def __init__(self) -> None:
        self.dropped = 0
        self._lock = threading.Lock()

    def add(self, count: int = 1) -> None:
        with self._lock:
            self.dropped += count


def counting_batch_processor(
    exporter: Any, drops: DropCounter, queue_size: int = SPAN_QUEUE_SIZE
) -> Any:
    """A BatchSpanProcessor with a large queue that counts the spans it has to drop."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    class CountingBatchSpanProcessor(BatchSpanProcessor):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # Looked up once, not per span: the SDK keeps one queue for the processor's life
            # (after a fork it clears that queue, it does not replace it).
            inner = getattr(self, "_batch_processor", None)
            limit = getattr(inner, "_max_queue_size", None)
            self._queue_limit: int = limit if limit is not None else 0
            # None where the SDK keeps no such queue (or no limit): nothing is counted.
            self._counted_queue = getattr(inner, "_queue", None) if limit is not None else None

        def on_end(self, span: Any) -> None:
            queue = self._counted_queue
            if queue is not None and len(queue) >= self._queue_limit:
                drops.add()
            BatchSpanProcessor.on_end(self, span)

    return CountingBatchSpanProcessor(
        exporter, max_queue_size=queue_size, max_export_batch_size=min(2048, queue_size)
    )


def provider_from_environment(drops: DropCounter) -> Any | None:
    """An SDK tracer provider when OTEL_TRACES_EXPORTER asks for one, else None (tracing off)."""
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true" or exporter_name in ("", "none"):
        return None
    from opentelemetry.sdk.trace import TracerProvider

    if exporter_name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        exporter: Any = ConsoleSpanExporter()
    elif exporter_name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            logger.warning(
                "OTEL_TRACES_EXPORTER=otlp needs "
                "`pip install opentelemetry-exporter-otlp-proto-http`; tracing stays off"
            )
            return None
        exporter = OTLPSpanExporter()
    else:
        logger.warning(
            "OTEL_TRACES_EXPORTER=%s is not supported (use console or otlp); tracing stays off",
            exporter_name,
        )
        return None
    provider = (
        TracerProvider()
    )  # resource and sampler from OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER...
    provider.add_span_processor(counting_batch_processor(exporter, drops))
    return provider


def is_recording_provider(provider: Any) -> bool:
    try:
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:  # pragma: no cover - the SDK is a core dependency
        return False
    return isinstance(provider, TracerProvider)


class RequestTracer:
    """Turns finished timelines into spans, and requests into the conventions' terms.

    `genai`: the `gen_ai.*` metrics (None when off); `provider_name` and `labels` (the model
    allow-list) make the `GenAIRequest` both the span and the metrics read."""

    def __init__(
        self,
        provider: Any | None,
        drops: DropCounter,
        *,
        genai: GenAIMetrics | None = None,
        provider_name: str = FALLBACK_PROVIDER,
        labels: ModelLabels | None = None,
    ) -> None:
        self.drops = drops
        self.genai = genai
        self.provider_name = provider_name
        self.labels = labels if labels is not None else ModelLabels()
        if provider is None:
            global_provider = trace.get_tracer_provider()
            provider = (
                global_provider
                if is_recording_provider(global_provider)
                else provider_from_environment(drops)
            )
        self.tracer = (
            provider.get_tracer("llm-slo.middleware", schema_url=SCHEMA_URL)
            if provider is not None and is_recording_provider(provider)
            else None
        )
        self.enabled = self.tracer is not None
        # The request span takes the ids already sent upstream in `traceparent`, so the
        # engine's span is its child (middleware.intake.propagate).
        self._ids: _PresetIds | None = None
        if self.tracer is not None and hasattr(self.tracer, "id_generator"):
            self._ids = _PresetIds(self.tracer.id_generator)
            self.tracer.id_generator = self._ids

    @property
    def wants_requests(self) -> bool:
        """Whether reports need the request's GenAI view (spans or `gen_ai.*` metrics on)."""
        return self.enabled or self.genai is not None

    def genai_request(self, route: str, outcome: str, exchange: Exchange) -> GenAIRequest:
        """The conventions' view of one finished request (read once, when it is reported)."""
        wire = exchange.wire
        reason = exchange.timeline.finish_reason  # the bundled engine's, where it said
        reasons = tuple(wire.finish_reasons) or ((reason,) if reason else ())
        return GenAIRequest.build(
            route=route,
            provider=self.provider_name,
            outcome=outcome,
            body=read_request_body(exchange.request_body),
            response_model=wire.response_model,
            response_id=wire.response_id,
            finish_reasons=reasons,
            server=exchange.server,
            stream=exchange.is_stream,
            labels=self.labels,
        )

    @staticmethod
    def parent_context(headers: Mapping[str, str]) -> Context | None:
        """The caller's trace context from a W3C `traceparent` header, if any."""
        if "traceparent" not in headers:
            return None
        return propagate.extract(headers)

    @staticmethod
    def trace_id_from_header(headers: Mapping[str, str]) -> str | None:
        header = headers.get("traceparent")
        if header is None:  # most requests: no split, no list
            return None
        parts = header.split("-")
        if len(parts) == 4 and len(parts[1]) == 32:
            return parts[1]
        return None

    def emit(
        self,
        timeline: RequestTimeline,
        breakdown: Breakdown,
        attributes: dict[str, Any],
        parent: Context | None,
        name: str,
        epoch_offset_ns: int,
        ids: HandedIds | None = None,
    ) -> str | None:
        """Emit the request's spans; returns the trace id (hex). `ids` are the server span's
        when they were already handed on."""
        tracer = self.tracer
        if tracer is None:
            return None
        if ids is not None and self._ids is not None:
            trace_number = ids[2]
            self._ids.preset(int(ids[0], 16) if trace_number is None else trace_number, ids[3])

        offset = epoch_offset_ns  # perf_counter ns + offset = unix ns (spans take wall time)
        start = timeline.start_ns
        end = start + round(breakdown.e2e_s * 1e9)
        try:
            server = tracer.start_span(
                name,
                context=parent,
                kind=trace.SpanKind.SERVER,
                start_time=start + offset,
                attributes=attributes,
            )
        finally:
            if self._ids is not None:
                self._ids.preset(None, None)
        if timeline.delay_blame:
            add_blame_events(server, timeline.delay_blame, end + offset)
        context = trace.set_span_in_context(server)
        for phase_name, begin, finish in phase_intervals(timeline, breakdown):
            # Named after its phase, and nothing more: an attribute repeating the name cost a
            # tenth of the request's telemetry.
            span = tracer.start_span(phase_name, context=context, start_time=begin + offset)
            if phase_name == "detokenize":
                add_detokenize_events(span, timeline.detokenize_marks, offset)
            span.end(end_time=finish + offset)
        # Error status where the server failed (HTTP semantics for SERVER spans: a 4xx is the
        # client's); `error.type` names every failure, the client's too.
        if attributes.get("http.response.status_code", 200) >= 500:
            server.set_status(trace.Status(trace.StatusCode.ERROR, attributes.get("error.type")))
        server.end(end_time=end + offset)
        return format(server.get_span_context().trace_id, "032x")


class _PresetIds:
    """An id generator that hands out preset ids once, then defers to the SDK's own."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._trace_id: int | None = None
        self._span_id: int | None = None
        self._random = bool(getattr(inner, "is_trace_id_random", lambda: True)())

    def preset(self, trace_id: int | None, span_id: int | None) -> None:
        self._trace_id, self._span_id = trace_id, span_id

    def generate_span_id(self) -> int:
        span_id = self._span_id
        if span_id is None:  # every span after the request's own
            return self.inner.generate_span_id()
        self._span_id = None
        return span_id

    def generate_trace_id(self) -> int:
        trace_id, self._trace_id = self._trace_id, None
        return self.inner.generate_trace_id() if trace_id is None else trace_id

    def is_trace_id_random(self) -> bool:
        return self._random  # asked for every root span: the inner generator's answer, once


def phase_intervals(timeline: RequestTimeline, breakdown: Breakdown) -> list[tuple[str, int, int]]:
    """(name, start_ns, end_ns) of each phase span, on the same cut points as the breakdown."""
    start = timeline.start_ns
    end = start + round(breakdown.e2e_s * 1e9)
    receive_end = min(max(timeline.receive_end_ns or start, start), end)
    spans = [("receive", start, receive_end)]
    if timeline.engine_reported and timeline.token_ns:
        enqueue = min(max(timeline.enqueue_ns or receive_end, receive_end), end)
        schedule = min(
            max(timeline.schedule_ns[0] if timeline.schedule_ns else enqueue, enqueue), end
        )
        first_token = min(max(timeline.token_ns[0], schedule), end)
        last_token = min(max(timeline.token_ns[-1], first_token), end)
        spans += [
            ("queue", enqueue, schedule),
            ("prefill", schedule, first_token),
            ("decode", first_token, last_token),
            ("detokenize", *_detokenize_interval(timeline.detokenize_marks, first_token, end)),
            ("send", last_token, end),
        ]
    else:
        first_byte = min(max(timeline.first_token_byte_ns or end, receive_end), end)
        cursor = receive_end
        if timeline.upstream_start_ns is not None:
            sent = min(max(timeline.upstream_start_ns, cursor), first_byte)
            spans.append(("proxy", cursor, sent))
            cursor = sent
            if timeline.upstream_connected_ns is not None:
                reached = min(max(timeline.upstream_connected_ns, cursor), first_byte)
                spans.append(("upstream_connect", cursor, reached))
                cursor = reached
        if breakdown.queue_prefill_s is not None:
            spans.append(("queue_prefill", cursor, first_byte))
        else:
            for name, seconds in (("queue", breakdown.queue_s), ("prefill", breakdown.prefill_s)):
                if seconds is not None:
                    until = min(cursor + round(seconds * 1e9), first_byte)
                    spans.append((name, cursor, until))
                    cursor = until
        chunks = timeline.token_chunk_ns
        last_chunk = min(max(chunks[-1], first_byte), end) if chunks else first_byte
        spans += [("decode", first_byte, last_chunk), ("send", last_chunk, end)]
    return spans


# A detokenize span carries one event per detokenization, up to this many (the rest counted).
DETOKENIZE_EVENTS = 32


def _detokenize_interval(marks: list[int], first_token: int, end: int) -> tuple[int, int]:
    """From the first detokenization's start to the last one's end (they interleave with
    decode: the span's `llm_slo.detokenize.busy_s` is the time spent in them)."""
    if not marks:
        return first_token, first_token
    begin = min(max(marks[0], first_token), end)
    return begin, min(max(marks[-1], begin), end)


def add_detokenize_events(span: Any, marks: list[int], offset: int) -> None:
    """Each detokenization as an event at its real start, with its duration; the time spent in
    them all and their count as attributes. (The breakdown's detokenize phase is the part of
    that time within decode, so the phases still add up: the last token's detokenization comes
    after decode's last token.)"""
    calls = len(marks) // 2
    busy_ns = sum(marks[1::2]) - sum(marks[0::2])
    span.set_attribute("llm_slo.detokenize.busy_s", busy_ns * 1e-9)
    span.set_attribute("llm_slo.detokenize.calls", calls)
    if calls > DETOKENIZE_EVENTS:
        span.set_attribute("llm_slo.detokenize.events_dropped", calls - DETOKENIZE_EVENTS)
    for index in range(0, 2 * min(calls, DETOKENIZE_EVENTS), 2):
        started, ended = marks[index], marks[index + 1]
        span.add_event(
            "detokenized",
            {"llm_slo.detokenize.duration_s": (ended - started) * 1e-9},
            timestamp=started + offset,
        )


BLAME_EVENT = "llm_slo.delay_caused"


def add_blame_events(span: Any, blame: dict[str, Any], at_ns: int) -> None:
    """Who made the request wait, on its server span: one event per culprit tier and cause of
    the record's `delay_blame` (bounded by the spec's tiers and the three causes), at the
    request's end, when the engine hands the blame over."""
    for entry in blame.get("by_tier", ()):
        span.add_event(
            BLAME_EVENT,
            {
                "llm_slo.delay.cause": entry["cause"],
                "llm_slo.delay.culprit_tier": entry["tier"],
                "llm_slo.delay.seconds": entry["s"],
                "llm_slo.delay.requests": entry["requests"],
            },
            timestamp=at_ns,
        )
