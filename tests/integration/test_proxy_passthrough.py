"""`slo proxy` refuses nothing: a request with tools, a JSON schema, logprobs or any other
field the bundled engine would refuse reaches the upstream as the client sent it, and the
upstream's answer (a tool call) comes back unchanged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from middleware.types import Receive, Scope, Send
from tests.helpers.openai_fields import REFUSED, WEATHER_TOOL
from tests.helpers.proxy_process import slo_proxy
from tests.helpers.servers import uvicorn_thread

pytestmark = pytest.mark.integration

TOOL_CALL = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "test-upstream",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            "logprobs": {"content": []},
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
}


class RecordingUpstream:
    """Raw ASGI: keeps each POST's body bytes, answers every request with a tool call."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        received = b""
        while True:
            message = await receive()
            received += message.get("body", b"")
            if not message.get("more_body", False):
                break
        answer = b"ok" if scope["path"] == "/health" else json.dumps(TOOL_CALL).encode()
        if scope["method"] == "POST":  # the proxy's own GETs (its model lookup) are not ours
            self.bodies.append(received)
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


@pytest.fixture
def upstream() -> Iterator[tuple[RecordingUpstream, str]]:
    app = RecordingUpstream()
    with uvicorn_thread(app) as base_url:
        yield app, base_url


def test_refused_fields_reach_the_upstream_unchanged(
    upstream: tuple[RecordingUpstream, str], tmp_path: Path
) -> None:
    app, upstream_url = upstream
    request: dict[str, Any] = {
        "model": "test-upstream",
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [WEATHER_TOOL],
        "tool_choice": "required",
        "response_format": REFUSED["response_format"][1],
        "logprobs": True,
        "top_logprobs": 2,
        "n": 2,
        "min_p": 0.1,
        "guided_json": {"type": "object"},
        "max_tokens": 5,
    }
    # Written by hand, with odd spacing and key order, to see that bytes are not re-encoded.
    raw = json.dumps(request, indent=1, sort_keys=False).encode()
    with slo_proxy(upstream_url, tmp_path / "records.db") as base_url:
        response = httpx.post(
            base_url + "/v1/chat/completions",
            content=raw,
            headers={"content-type": "application/json"},
            timeout=30,
        )
    assert response.status_code == 200, response.text
    assert response.json() == TOOL_CALL
    assert app.bodies == [raw]


def test_the_openai_client_gets_its_tool_call_through_the_proxy(
    upstream: tuple[RecordingUpstream, str], tmp_path: Path
) -> None:
    openai = pytest.importorskip("openai")
    app, upstream_url = upstream
    with slo_proxy(upstream_url, tmp_path / "records.db") as base_url:
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model="test-upstream",
            messages=[{"role": "user", "content": "Weather in Oslo?"}],
            tools=[WEATHER_TOOL],
            response_format={"type": "json_object"},
            max_tokens=5,
        )
    call = reply.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {
        "city": "Oslo"
    }
    sent = json.loads(app.bodies[0])
    assert sent["tools"] == [WEATHER_TOOL] and sent["response_format"] == {"type": "json_object"}


STREAMED_REQUEST = {
    "model": "test-upstream",
    "messages": [{"role": "user", "content": "Weather in Oslo?"}],
    "tools": [WEATHER_TOOL],
    "response_format": {"type": "json_object"},
    "logprobs": True,
    "stream": True,
}


def test_a_streamed_request_reaches_the_upstream_unchanged_without_usage_injection(
    upstream: tuple[RecordingUpstream, str], tmp_path: Path
) -> None:
    app, upstream_url = upstream
    raw = json.dumps(STREAMED_REQUEST).encode()
    with slo_proxy(upstream_url, tmp_path / "records.db", "--no-inject-usage") as base_url:
        headers = {"content-type": "application/json"}
        httpx.post(base_url + "/v1/chat/completions", content=raw, headers=headers, timeout=30)
    assert app.bodies == [raw]


def test_a_streamed_request_gains_only_include_usage_by_default(
    upstream: tuple[RecordingUpstream, str], tmp_path: Path
) -> None:
    """By default the proxy asks for usage on the client's behalf (exact token counts): the
    request reaches the upstream with `stream_options.include_usage` added, every other field
    as the client sent it."""
    app, upstream_url = upstream
    raw = json.dumps(STREAMED_REQUEST).encode()
    with slo_proxy(upstream_url, tmp_path / "records.db") as base_url:
        headers = {"content-type": "application/json"}
        httpx.post(base_url + "/v1/chat/completions", content=raw, headers=headers, timeout=30)
    [sent] = app.bodies
    assert json.loads(sent) == {**STREAMED_REQUEST, "stream_options": {"include_usage": True}}
