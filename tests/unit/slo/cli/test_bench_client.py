"""One benchmark request: SSE parsing, the server's timings, and the record it becomes.

Structure only (which chunk counts, which fields are filled); the timing accuracy is checked
against a server with scripted delays in tests/integration/test_bench.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from middleware.request.reporting import server_timing_value, timings_comment
from middleware.request.timeline import Breakdown
from slo.cli.bench.client import RequestSettings, measure, request_body
from slo.cli.bench.profiles import PlannedRequest
from slo.cli.bench.timings import parse_server_timing, parse_timings_comment
from slo.records import validate_record
from slo.sli import outcome_for_status

PLANNED = PlannedRequest(3, "premium", "[3] the of", 10, 4, 0.0)
BREAKDOWN = Breakdown(e2e_s=0.5, ttft_s=0.2, tpot_s=0.1, itl_s=(), network_s=0.01, queue_s=0.02,
                      prefill_s=0.15, decode_s=0.29, detokenize_s=0.005, other_s=0.025,
                      output_tokens=4)  # fmt: skip


def sse(data: Any) -> bytes:
    return b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode()) + b"\n\n"


def chat_chunk(content: str | None, finish: str | None = None, role: bool = False) -> bytes:
    delta: dict[str, Any] = {"role": "assistant"} if role else {}
    if content is not None:
        delta["content"] = content
    return sse({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def run(handler: Any, settings: RequestSettings, planned: PlannedRequest = PLANNED) -> Any:
    async def go() -> Any:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await measure(client, "http://server", planned, settings)

    return asyncio.run(go())


def test_the_server_timing_formats_the_middleware_writes_parse_back() -> None:
    comment = timings_comment(BREAKDOWN).decode().strip()
    assert parse_timings_comment(comment) == {
        "network_s": 0.01, "queue_s": 0.02, "prefill_s": 0.15, "queue_prefill_s": 0.0,
        "decode_s": 0.29,
        "detokenize_s": 0.005, "other_s": 0.025, "e2e_s": 0.5, "ttft_s": 0.2, "output_tokens": 4,
    }  # fmt: skip
    header = parse_server_timing(server_timing_value(BREAKDOWN))
    assert header["e2e_s"] == pytest.approx(0.5) and header["prefill_s"] == pytest.approx(0.15)


def test_foreign_and_broken_server_timing_entries_are_skipped() -> None:
    parsed = parse_server_timing('cdn-cache;desc="HIT", e2e;dur=12.5, queue;dur=abc, ttft;desc=x')
    assert parsed == {"e2e_s": 0.0125}
    assert parse_server_timing(None) == {}
    assert parse_timings_comment(": keep-alive") is None
    assert parse_timings_comment(': llm-slo-timings {"e2e_s": -1, "bogus_s": 2}') == {}


def test_a_chat_stream_becomes_a_record_with_both_views() -> None:
    body = b"".join([
        chat_chunk("", role=True),  # the role chunk carries no output: not the first token
        chat_chunk("ab"), chat_chunk(None), chat_chunk("c"), chat_chunk("d", finish="length"),
        sse({"choices": [], "usage": {"prompt_tokens": 31, "completion_tokens": 4}}),
        sse(b"[DONE]"), timings_comment(BREAKDOWN),
    ])  # fmt: skip
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            200,
            content=body,
            headers={"x-request-id": "req-abc", "content-type": "text/event-stream"},
        )

    result = run(handler, RequestSettings("m", "chat", seed=100))
    sent = json.loads(seen[0].content)
    assert seen[0].url.path == "/v1/chat/completions"
    assert seen[0].headers["x-llm-tier"] == "premium"
    assert sent["messages"] == [{"role": "user", "content": "[3] the of"}]
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["ignore_eos"] is True and sent["seed"] == 103 and sent["max_tokens"] == 4
    assert result.text_chunks == 3 and len(result.itl_s) == 2
    assert result.ttft_s is not None and result.ttft_s <= result.e2e_s

    record = result.to_record("m")
    validate_record(record)  # what `slo check --results` will read
    assert record["request_id"] == "req-abc" and record["tier"] == "premium"
    assert record["input_tokens"] == 31 and record["output_tokens"] == 4
    assert record["e2e_s"] == 0.5 and record["ttft_s"] == 0.2 and record["prefill_s"] == 0.15
    assert record["tpot_s"] == pytest.approx((0.5 - 0.2) / 3)
    assert record["client_tpot_s"] == pytest.approx(
        (record["client_e2e_s"] - record["client_ttft_s"]) / 3, abs=2e-6
    )
    assert len(record["client_itl_s"]) == 2


def test_text_completions_without_usage_or_timings_count_chunks() -> None:
    def text(value: str, finish: str | None = None) -> bytes:
        return sse({"choices": [{"index": 0, "text": value, "finish_reason": finish}]})

    body = text("a") + text("") + text("b") + text("c", "length") + sse(b"[DONE]")
    result = run(lambda _: httpx.Response(200, content=body),
                 RequestSettings("m", "completions", ignore_eos=False))  # fmt: skip
    record = result.to_record("m")
    validate_record(record)
    assert record["route"] == "/v1/completions"
    assert record["output_tokens"] == 3 and record["input_tokens"] == PLANNED.input_tokens
    assert record["e2e_s"] == record["client_e2e_s"]  # no server view: the client's stands in
    assert "ttft_s" not in record and "network_s" not in record
    assert "ignore_eos" not in request_body(PLANNED, RequestSettings("m", "completions",
                                                                     ignore_eos=False))  # fmt: skip


def test_a_reply_with_no_text_takes_ttft_from_its_finish_chunk() -> None:
    body = chat_chunk("", role=True) + chat_chunk(None, finish="length") + sse(b"[DONE]")
    result = run(lambda _: httpx.Response(200, content=body), RequestSettings("m", "chat"))
    assert result.ttft_s is not None and result.text_chunks == 0


def test_errors_become_outcomes() -> None:
    overloaded = run(
        lambda _: httpx.Response(429, json={"error": {"message": "the server is overloaded"}}),
        RequestSettings("m", "chat"),
    )
    assert overloaded.outcome == "rate_limited" and overloaded.status == 429
    assert overloaded.error == "the server is overloaded"
    mid_stream = run(
        lambda _: httpx.Response(200, content=chat_chunk("a") + sse({"error": {"code": 500}})),
        RequestSettings("m", "chat"),
    )
    assert mid_stream.outcome == "server_error"

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    refused = run(refuse, RequestSettings("m", "chat"))
    assert refused.outcome == "server_error" and refused.status == 0
    validate_record(refused.to_record("m"))


def test_non_streamed_requests_read_the_server_timing_header() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["stream"] is False
        return httpx.Response(
            200,
            json={
                "choices": [{"text": "abc"}],
                "usage": {"prompt_tokens": 9, "completion_tokens": 3},
            },
            headers={"server-timing": server_timing_value(BREAKDOWN)},
        )

    record = run(handler, RequestSettings("m", "completions", stream=False)).to_record("m")
    assert record["e2e_s"] == pytest.approx(0.5) and record["stream"] is False
    assert record["output_tokens"] == 3 and "client_ttft_s" not in record


@pytest.mark.parametrize(
    ("status", "outcome"),
    [(200, "ok"), (400, "client_error"), (429, "rate_limited"), (503, "shed"), (504, "timeout"),
     (499, "cancelled"), (500, "server_error")],
)  # fmt: skip
def test_outcomes_are_the_middlewares(status: int, outcome: str) -> None:
    assert outcome_for_status(status) == outcome
