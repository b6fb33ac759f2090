"""A vLLM-style ASGI app on a scripted clock, one request through an ASGI app, and the one record
it left: the middleware's tests on engines it only sees through the wire.

Every timing is the scripted clock's: the app advances it as an engine would take time, and
`call`'s receive advances it 2 ms (reading the body), so a test can name each phase exactly.
"""

from __future__ import annotations

import json
from typing import Any

from middleware import ScriptedClock
from slo.records import RequestRecord
from slo.store import RecordStore

# A W3C trace context the engine's spans can be joined on.
TRACE = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = [(b"traceparent", f"00-{TRACE}-b7ad6b7169203331-01".encode())]


def sse(data: Any) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def chat_delta(**fields: Any) -> bytes:
    return sse({"choices": [{"index": 0, "delta": fields, "finish_reason": None}]})


def vllm_style_app(clock: ScriptedClock, seen_requests: list[dict[str, Any]]) -> Any:
    """vLLM's shape: an empty role chunk at the end of prefill, deltas that carry several
    tokens, a usage chunk only when `stream_options.include_usage` asks."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        message = await receive()
        request = json.loads(message["body"])
        seen_requests.append(request)
        start = {"type": "http.response.start", "status": 200,
                 "headers": [(b"content-type", b"text/event-stream")]}  # fmt: skip
        await send(start)
        clock.advance_ms(40)  # queue + prefill: nobody says how it splits
        await send({"type": "http.response.body", "more_body": True,
                    "body": chat_delta(role="assistant", content="")})  # fmt: skip
        clock.advance_ms(3)
        for text in ("one two", " three", " four five six"):  # 6 tokens in 3 deltas
            await send({"type": "http.response.body", "body": chat_delta(content=text),
                        "more_body": True})  # fmt: skip
            clock.advance_ms(10)
        finish = sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        await send({"type": "http.response.body", "body": finish, "more_body": True})
        if (request.get("stream_options") or {}).get("include_usage"):
            usage = sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 6}})
            await send({"type": "http.response.body", "body": usage, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


async def call(
    app: Any, clock: ScriptedClock, body: dict[str, Any], headers: list[Any] | None = None
) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    raw = json.dumps(body).encode()

    async def receive() -> dict[str, Any]:
        clock.advance_ms(2)
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": headers or [(b"content-length", str(len(raw)).encode())],
        "state": {},
    }
    await app(scope, receive, send)
    return sent


def only_record(store: RecordStore) -> RequestRecord:
    store.flush()
    (record,) = store.query()
    return record
