"""OTLP/HTTP trace exports, as the real SDK exporter encodes them, decoded into engine spans."""

from __future__ import annotations

import gzip
import json

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from middleware.intake import IntakeError, decode_export

VLLM_ATTRIBUTES = {
    "gen_ai.request.id": "chatcmpl-req-1",
    "gen_ai.latency.time_in_queue": 0.125,
    "gen_ai.latency.time_in_model_prefill": 0.0625,
    "gen_ai.latency.time_in_model_decode": 0.5,
    "gen_ai.usage.prompt_tokens": 12,
    "gen_ai.usage.completion_tokens": 30,
}


def finished_spans() -> list:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("vllm")
    tracer.start_span("llm_request", attributes=VLLM_ATTRIBUTES).end()
    tracer.start_span("some other span").end()
    return list(exporter.get_finished_spans())


def test_protobuf_plain_and_gzip() -> None:
    spans = finished_spans()
    body = encode_spans(spans).SerializeToString()
    trace_id = format(spans[0].context.trace_id, "032x")
    for payload, encoding in ((body, ""), (gzip.compress(body), "gzip")):
        (read,) = decode_export(payload, "application/x-protobuf", encoding)
        assert read.trace_id == trace_id and read.engine == "vllm"
        assert (read.queue_s, read.prefill_s, read.decode_s) == (0.125, 0.0625, 0.5)
        assert (read.input_tokens, read.output_tokens) == (12, 30)
        assert read.request_id == "chatcmpl-req-1"


def test_json_with_hex_ids_and_string_ints() -> None:
    export = {"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": "5B8EFFF798038103D269B633813FC60C", "spanId": "EEE19B7EC3C1B174",
        "name": "llm_request", "attributes": [
            {"key": "gen_ai.latency.time_in_queue", "value": {"doubleValue": 0.25}},
            {"key": "gen_ai.usage.completion_tokens", "value": {"intValue": "7"}},
        ]}]}]}]}  # fmt: skip
    (read,) = decode_export(json.dumps(export).encode(), "application/json; charset=utf-8")
    assert read.trace_id == "5b8efff798038103d269b633813fc60c"
    assert read.queue_s == 0.25 and read.output_tokens == 7 and read.prefill_s is None


@pytest.mark.parametrize(
    ("body", "content_type", "encoding", "says"),
    [
        (b"\xff\x00garbage", "application/x-protobuf", "", "protobuf"),
        (b"{not json", "application/json", "", "not JSON"),
        (b"plain", "application/json", "gzip", "gzip"),
        (b"{}", "text/plain", "", "Content-Type"),
        (b"{}", "application/json", "br", "Content-Encoding"),
        (b"plain", "application/json", "deflate", "deflate"),
        (b'{"resourceSpans": 3}', "application/json", "", "resourceSpans"),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "llm_request", '
            b'"traceId": "xyz"}]}]}]}',
            "application/json",
            "",
            "traceId",
        ),
    ],
)
def test_bad_exports_are_refused_with_the_reason(
    body: bytes, content_type: str, encoding: str, says: str
) -> None:
    with pytest.raises(IntakeError, match=says):
        decode_export(body, content_type, encoding)


def test_a_gzip_bomb_is_refused() -> None:
    bomb = gzip.compress(b"\0" * (20 << 20))
    with pytest.raises(IntakeError, match="exceeds"):
        decode_export(bomb, "application/x-protobuf", "gzip")


def test_sglang_and_tgi_spans_are_read_by_their_adapters() -> None:
    from middleware.upstream import adapter_for_span
    from middleware.upstream.engines.tgi import rust_duration_s

    assert adapter_for_span(" Req 1a2b3c4d").name == "sglang"  # type: ignore[union-attr]
    assert adapter_for_span("prefill Req 1a2b3c4d").name == "sglang"  # type: ignore[union-attr]
    assert adapter_for_span("generate_stream").name == "tgi"  # type: ignore[union-attr]
    assert adapter_for_span("Required thing") is None
    assert rust_duration_s("1.5ms") == pytest.approx(0.0015)
    assert rust_duration_s("850µs") == pytest.approx(0.00085)
    assert rust_duration_s("2s") == 2.0 and rust_duration_s("soon") is None
    export = {"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "ab" * 16, "name": "generate_stream", "attributes": [
            {"key": "queue_time", "value": {"stringValue": "12.5ms"}}]},
        {"traceId": "cd" * 16, "name": " Req 0f0f0f0f", "attributes": [
            {"key": "gen_ai.latency.time_in_model_prefill", "value": {"doubleValue": 0.02}},
            {"key": "gen_ai.request.id", "value": {"stringValue": "0f0f0f0f99"}}]},
    ]}]}]}  # fmt: skip
    tgi, sglang = decode_export(json.dumps(export).encode(), "application/json")
    assert tgi.engine == "tgi" and tgi.queue_s == pytest.approx(0.0125)
    # Its prefill figure holds the queue wait: not taken as prefill.
    assert sglang.engine == "sglang" and sglang.prefill_s is None and sglang.queue_s is None
