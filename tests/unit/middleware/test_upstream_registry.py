"""The engine registry's header and body hooks: headers and body keys come with the function
that reads them, and an adapter registered at any time is read from every response after it,
by both hot paths."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

import middleware.wire.chunk as wire_chunk
from middleware.upstream import ADAPTERS, EngineAdapter, UpstreamReport, read_response_headers
from middleware.upstream.engines import ENGINE_MODULES
from middleware.upstream.registry import (
    BODY_KEYS,
    BODY_KEYS_LISTENERS,
    RESPONSE_HEADERS,
    read_response_body,
    register,
)
from middleware.wire.reader import WireReader
from tests.helpers.hotpath import each_hotpath  # noqa: F401  (runs each test on both hot paths)


def _queue_header(report: UpstreamReport, headers: Mapping[bytes, bytes]) -> bool:
    report.queue_s = int(headers[b"x-late-queue-ms"]) / 1000
    return True


@pytest.fixture
def late_adapter() -> Iterator[EngineAdapter]:
    adapter = register(
        EngineAdapter(
            name="late", headers=frozenset({b"x-late-queue-ms"}), read_headers=_queue_header
        )
    )
    try:
        yield adapter
    finally:
        del ADAPTERS["late"]
        RESPONSE_HEADERS.discard(b"x-late-queue-ms")


def test_every_engine_module_registers_at_import() -> None:
    assert {name.rsplit(".", 1)[1] for name in ENGINE_MODULES} <= set(ADAPTERS)


def test_headers_need_their_reader_and_lower_case() -> None:
    with pytest.raises(ValueError, match="read_headers"):
        EngineAdapter(name="x", headers=frozenset({b"x-a"}))
    with pytest.raises(ValueError, match="read_headers"):
        EngineAdapter(name="x", read_headers=_queue_header)
    with pytest.raises(ValueError, match="lower case"):
        EngineAdapter(name="x", headers=frozenset({b"X-A"}), read_headers=_queue_header)


def test_an_adapter_registered_later_is_read(late_adapter: EngineAdapter) -> None:
    assert b"x-late-queue-ms" in RESPONSE_HEADERS
    report = UpstreamReport()
    assert read_response_headers(report, {b"x-late-queue-ms": b"25"})
    assert report.queue_s == 0.025


def test_headers_no_adapter_reads_take_nothing() -> None:
    report = UpstreamReport()
    assert not read_response_headers(report, {b"x-compute-type": b"gpu"})
    assert report == UpstreamReport()


def _late_body(report: UpstreamReport, found: Mapping[str, Any]) -> bool:
    stats = found.get("x_late_stats")
    if not isinstance(stats, Mapping) or type(stats.get("queue_ms")) is not int:
        return False
    report.queue_s = stats["queue_ms"] / 1000
    return True


@pytest.fixture
def late_body_adapter() -> Iterator[EngineAdapter]:
    adapter = register(
        EngineAdapter(name="late-body", body_keys=("x_late_stats",), read_body=_late_body)
    )
    try:
        yield adapter
    finally:
        del ADAPTERS["late-body"]
        BODY_KEYS.remove("x_late_stats")
        for listener in BODY_KEYS_LISTENERS:
            listener()


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def test_body_keys_need_their_reader_and_their_own_names() -> None:
    with pytest.raises(ValueError, match="read_body"):
        EngineAdapter(name="x", body_keys=("x_stats",))
    with pytest.raises(ValueError, match="read_body"):
        EngineAdapter(name="x", read_body=_late_body)
    with pytest.raises(ValueError, match="OpenAI fields"):
        EngineAdapter(name="x", body_keys=("usage",), read_body=_late_body)
    with pytest.raises(ValueError, match="both read the body keys"):
        register(EngineAdapter(name="x", body_keys=("timings",), read_body=_late_body))
    assert "x" not in ADAPTERS


def test_a_body_adapter_registered_later_is_read(late_body_adapter: EngineAdapter) -> None:
    assert "x_late_stats" in BODY_KEYS
    reader = WireReader()
    text = {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}
    # Its report rides in a chunk with text: the chunk is a token event and its report is read.
    assert reader.token_events_in(_sse({**text, "x_late_stats": {"queue_ms": 30}})) == 1
    assert reader.token_events_in(_sse(text)) == 1
    assert reader.token_events == 2 and reader.report.queue_s == 0.03
    body = WireReader()
    assert body.read_body(json.dumps({"choices": [{"text": "x"}], "x_late_stats": {"queue_ms": 5}}))
    assert body.report.queue_s == 0.005


def test_a_report_in_a_usual_chunk_is_never_skipped() -> None:
    # llama.cpp with `timings_per_token` sends its timings in every chunk with text: each is read.
    reader = WireReader()
    for predicted in (1, 2):
        timings = {"predicted_n": predicted, "prompt_ms": 4.0}
        chunk = {"choices": [{"index": 0, "delta": {"content": "a"}}], "timings": timings}
        assert reader.token_events_in(_sse(chunk)) == 1
        assert (reader.output_tokens, reader.tokens_source) == (predicted, "timings")
    assert reader.report.prefill_s == 0.004


def test_objects_no_adapter_reads_and_null_reports_take_nothing() -> None:
    reader = WireReader()
    chunk = {"choices": [{"index": 0, "delta": {"content": "a"}}], "x_other": {"a": 1}}
    assert reader.token_events_in(_sse(chunk)) == 1
    assert reader.token_events_in(_sse({**chunk, "timings": None})) == 1
    assert reader.report == UpstreamReport() and reader.tokens_source == "chunks"
    assert not read_response_body(UpstreamReport(), {"x_other": {"a": 1}})
    assert wire_chunk.reports_in(wire_chunk.decode_chunk(b'{"timings": null}')) == {}
