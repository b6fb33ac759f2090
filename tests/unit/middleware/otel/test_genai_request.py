"""What the GenAI view of a request reads: the request body's fields, the answer's id, model and
finish reasons (first event only, whatever the stream's shape), and captured content as the
conventions' message lists."""

from __future__ import annotations

import json
from typing import Any

import pytest

from middleware.capture import CaptureBuffer, ContentCapture
from middleware.otel.models import ModelLabels
from middleware.otel.request import GenAIRequest, operation_for_route, read_request_body
from middleware.wire.reader import WireReader
from tests.helpers.hotpath import each_hotpath  # noqa: F401  (runs each test on both hot paths)


def event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


STREAM = [
    event({"id": "chatcmpl-9", "model": "qwen-7b", "choices": [{"delta": {"role": "assistant"}}]}),
    *(
        event({"id": "chatcmpl-9", "model": "qwen-7b", "choices": [{"delta": {"content": t}}]})
        for t in ("Hel", "lo")
    ),
    event({"id": "x", "model": "y", "choices": [{"delta": {}, "finish_reason": "stop"}]}),
    b"data: [DONE]\n\n",
]


@pytest.mark.parametrize("path", ["token_events_in", "feed", "one_piece"])
def test_the_answer_id_model_and_finish_reasons(path: str) -> None:
    wire = WireReader()
    if path == "one_piece":  # several events in one body message: the slow path
        wire.feed(b"".join(STREAM))
    for chunk in STREAM if path != "one_piece" else ():
        wire.token_events_in(chunk) if path == "token_events_in" else wire.feed(chunk)
    assert (wire.response_id, wire.response_model) == ("chatcmpl-9", "qwen-7b")  # the first
    assert wire.finish_reasons == ["stop"]
    assert wire.token_events == 2


def test_a_plain_body_gives_id_model_and_reasons() -> None:
    wire = WireReader()
    choices = [{"text": "a", "finish_reason": "length"}, {"text": "b", "finish_reason": "stop"}]
    body = {"id": "cmpl-1", "model": "m", "choices": choices}
    wire.read_body(json.dumps(body).encode())
    assert (wire.response_id, wire.response_model) == ("cmpl-1", "m")
    assert wire.finish_reasons == ["length", "stop"]


def test_request_fields_of_any_shape() -> None:
    body = read_request_body(b'{"messages": [{"role": "user", "content": "x"}], "model": "m",'
                             b' "max_completion_tokens": 9, "temperature": 1, "top_p": "high",'
                             b' "stream": true, "n": 1, "seed": 3}')  # fmt: skip
    request = GenAIRequest.build(
        route="/v1/chat/completions", provider="p", outcome="ok", body=body,
        response_model=None, response_id=None, finish_reasons=(), server=None, stream=True,
        labels=ModelLabels(["m"]),
    )  # fmt: skip
    attributes = request.span_attributes(1, 2)
    assert request.span_name == "chat m"
    assert attributes["gen_ai.request.max_tokens"] == 9  # max_completion_tokens, the newer name
    assert attributes["gen_ai.request.temperature"] == 1.0
    assert "gen_ai.request.top_p" not in attributes  # not a number: not recorded
    assert "gen_ai.request.choice.count" not in attributes  # n == 1
    assert "server.address" not in attributes and "server.port" not in attributes
    assert read_request_body(b"not json").model is None
    assert read_request_body(None).model is None


def test_unlisted_and_missing_models_name_the_span_by_operation() -> None:
    labels = ModelLabels(["m"])
    for model, name in ((None, "text_completion"), ("evil" * 100, "text_completion")):
        body = read_request_body(json.dumps({"model": model}).encode())
        request = GenAIRequest.build(
            route="/v1/completions", provider="p", outcome="timeout", body=body,
            response_model=None, response_id=None, finish_reasons=(), server=("h", 1),
            stream=False, labels=labels,
        )  # fmt: skip
        assert request.span_name == name
        assert request.error_type == "timeout"
        attributes = request.span_attributes(0, 0)
        assert len(attributes.get("gen_ai.request.model", "")) <= 256
    assert operation_for_route("/v1/batch/jobs") == "text_completion"


def captured(request: bytes, response: list[bytes], capture: ContentCapture) -> dict[str, Any]:
    buffer = CaptureBuffer(capture.max_chars * 4)
    buffer.add_request(request)
    for chunk in response:
        buffer.add_response(chunk)
    return {k: json.loads(v) for k, v in capture.span_attributes(buffer).items()}


def test_captured_chat_as_the_conventions_messages() -> None:
    request = {"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "mail a@b.io"},
                                     {"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "assistant",
         "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]}  # fmt: skip
    attributes = captured(json.dumps(request).encode(), STREAM, ContentCapture())
    messages = attributes["gen_ai.input.messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[1]["parts"] == [
        {"type": "text", "content": "mail [REDACTED]"},
        {"type": "image_url"},
    ]
    assert messages[2]["parts"] == [
        {"type": "tool_call", "id": "c1", "name": "f", "arguments": "{}"}
    ]
    assert messages[3]["parts"] == [{"type": "tool_call_response", "id": "c1", "response": "42"}]
    assert attributes["gen_ai.output.messages"] == [
        {"role": "assistant", "parts": [{"type": "text", "content": "Hello"}]}
    ]


def test_captured_text_is_bounded_and_cut_bodies_stay_text() -> None:
    capture = ContentCapture(max_chars=10)  # the buffer keeps 40 bytes of each body
    whole = captured(b'{"prompt": "word word word"}', [b'{"choices": [{"text": "'], capture)
    (message,) = whole["gen_ai.input.messages"]
    assert message == {"role": "user", "parts": [{"type": "text", "content": "word word "}]}
    (answer,) = whole["gen_ai.output.messages"]  # not JSON: kept as captured, as text
    assert answer == {"role": "assistant", "parts": [{"type": "text", "content": '{"choices"'}]}
    cut = captured(json.dumps({"prompt": "word " * 100}).encode(), [], capture)
    (message,) = cut["gen_ai.input.messages"]  # cut by the bound: its first characters
    assert message == {"role": "user", "parts": [{"type": "text", "content": '{"prompt":'}]}
