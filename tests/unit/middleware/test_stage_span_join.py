"""An engine's stage spans (SGLang's `prefill_waiting`, `prefill_forward`, `decode_loop` under
its request span) are read from OTLP exports, summed by trace id, and joined with the request
span exactly once: queue, prefill and decode from the stages, counts from the request span."""

from __future__ import annotations

import json

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import set_span_in_context

from middleware.intake import SpanJoin, decode_export
from middleware.upstream import ADAPTERS, EngineAdapter, SpanPhases, register
from middleware.upstream.engines.sglang import read_sglang_stages

MS = 1_000_000


def sglang_trace(start_ns: int, stages: list[tuple[str, int, int]]) -> list:
    """A root span `" Req 1a2b3c4d"` with a thread span whose children are the stages (name,
    start and end in ms after `start_ns`), as SGLang's TraceReqContext nests them."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("sglang server")
    end = start_ns + max(stop for _n, _s, stop in stages) * MS + MS
    root = tracer.start_span(" Req 1a2b3c4d", start_time=start_ns)
    thread = tracer.start_span("Scheduler (pid:1)", set_span_in_context(root), start_time=start_ns)
    for name, begin, stop in stages:
        child = tracer.start_span(
            name, set_span_in_context(thread), start_time=start_ns + begin * MS
        )
        child.end(end_time=start_ns + stop * MS)
    thread.end(end_time=end)
    root.set_attributes(
        {"gen_ai.usage.completion_tokens": 3, "gen_ai.latency.time_in_model_decode": 9.0}
    )
    root.end(end_time=end)
    return list(exporter.get_finished_spans())


STAGES = [
    ("request_process", 0, 1),
    ("prefill_waiting", 1, 41),
    ("chunked_prefill", 41, 51),  # inside prefill_forward: not counted twice
    ("prefill_forward", 41, 71),
    ("decode_waiting", 71, 72),
    ("decode_loop", 72, 82),
    ("decode_loop", 82, 95),
]


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_stage_spans_are_read_with_their_durations(encoding: str) -> None:
    spans = sglang_trace(10**18, STAGES)
    message = encode_spans(spans)
    if encoding == "protobuf":
        read = decode_export(message.SerializeToString(), "application/x-protobuf")
    else:
        body = json.dumps(MessageToDict(message)).encode()
        read = decode_export(body, "application/json")
    stages = [(s.stage, round(s.stage_s or 0, 6)) for s in read if s.stage]
    assert stages == [
        ("prefill_waiting", 0.04),
        ("chunked_prefill", 0.01),
        ("prefill_forward", 0.03),
        ("decode_loop", 0.01),
        ("decode_loop", 0.013),
    ]
    (root,) = [s for s in read if s.stage is None]
    assert root.engine == "sglang" and root.output_tokens == 3
    assert {s.trace_id for s in read} == {root.trace_id}


def join_of(spans: list) -> tuple[SpanJoin, list[SpanPhases]]:
    return SpanJoin(5.0, expect="always"), decode_export(
        encode_spans(spans).SerializeToString(), "application/x-protobuf"
    )


def test_the_request_span_joins_with_its_stages_once() -> None:
    join, read = join_of(sglang_trace(10**18, STAGES))
    trace_id = read[0].trace_id
    reports: list[SpanPhases | None] = []
    join.begin(trace_id, None)
    join.end(trace_id, None)
    assert join.settle(trace_id, None, reports.append) == 5.0
    join.add(read[:3])  # the stages come first (they end first) ...
    assert reports == []
    join.add(read[3:])  # ... the request span with the rest
    (report,) = reports
    assert report is not None
    assert (report.queue_s, report.prefill_s, report.decode_s) == pytest.approx((0.04, 0.03, 0.023))
    assert report.output_tokens == 3
    join.add([s for s in read if s.stage is None])  # exported twice
    assert len(reports) == 1 and join.counts.duplicates == 1 and join.counts.joined == 1


def test_a_request_span_held_before_its_request_ended_takes_its_stages() -> None:
    join, read = join_of(sglang_trace(10**18, STAGES))
    trace_id = read[0].trace_id
    join.begin(trace_id, None)
    join.add(read)
    join.end(trace_id, None)
    reports: list[SpanPhases | None] = []
    assert join.settle(trace_id, None, reports.append) is None
    (report,) = reports
    assert report is not None and report.queue_s == pytest.approx(0.04)


def test_late_and_stray_stages_are_counted_unmatched() -> None:
    join, read = join_of(sglang_trace(10**18, STAGES))
    trace_id = read[0].trace_id
    reports: list[SpanPhases | None] = []
    join.begin(trace_id, None)
    join.end(trace_id, None)
    join.settle(trace_id, None, reports.append)
    join.add([s for s in read if s.stage is None])  # the request span alone: the root's decode
    (report,) = reports
    assert report is not None and (report.queue_s, report.decode_s) == (None, 9.0)
    join.add([s for s in read if s.stage])  # too late for it
    assert join.counts.unmatched == 5
    stray = SpanJoin(5.0, expect="always", hold_s=1.0, now=lambda: 0.0)
    stray.add([SpanPhases("t9", engine="sglang", stage="decode_loop", stage_s=0.1)] * 2)
    stray.now = lambda: 2.0
    stray.expire()  # held past hold_s: dropped, each counted
    assert stray.counts.unmatched == 2


def test_prefill_is_the_forward_or_the_chunks_standing_alone() -> None:
    assert read_sglang_stages({"prefill_forward": 0.3, "chunked_prefill": 0.1}) == {
        "prefill_s": 0.3
    }
    assert read_sglang_stages({"chunked_prefill": 0.1, "decode_loop": 0.2}) == {
        "prefill_s": 0.1,
        "decode_s": 0.2,
    }


def test_stage_spans_come_with_their_reader_and_belong_to_one_engine() -> None:
    with pytest.raises(ValueError, match="`stage_spans` and `read_stages` come together"):
        EngineAdapter(name="acme", stage_spans=frozenset({"queued"}))
    taken = EngineAdapter(name="acme", stage_spans=frozenset({"decode_loop"}), read_stages=dict)
    with pytest.raises(ValueError, match="both claim stage spans named \\['decode_loop'\\]"):
        register(taken)
    assert "acme" not in ADAPTERS
