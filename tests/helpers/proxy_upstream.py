"""A small OpenAI-style upstream for the `slo proxy` tests and benchmark: raw ASGI, so its own
cost stays low and it can tell when a client walked away.

    python -m tests.helpers.proxy_upstream --port 8081 [--itl-ms 1]

POST /v1/chat/completions and /v1/completions: `max_tokens` text chunks; streamed as SSE (a role
chunk first for chat, text deltas, a finish chunk, `data: [DONE]`) or as one JSON body with
`usage`. Test knobs in request headers: `x-test-delay-s` (wait before the response headers),
`x-test-itl-s` (wait between chunks), `x-test-events-per-write` (write that many SSE events in
one body message, as a busy server or TCP does). GET /health answers "ok".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from middleware.types import Receive, Scope, Send

_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class OpenAIUpstream:
    def __init__(self, itl_s: float = 0.0) -> None:
        self.itl_s = itl_s
        self.requests = 0
        self.completed = 0
        self.disconnects = 0  # streams the client (the proxy) walked away from
        self.last_headers: dict[str, str] = {}
        self.last_path = ""
        self.last_request: dict[str, Any] = {}  # the JSON body it was last sent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        if scope["path"] == "/health":
            await _answer(send, 200, b"ok", b"text/plain")
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.requests += 1
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.last_headers = headers
        query = scope.get("query_string", b"").decode()
        self.last_path = scope["path"] + (f"?{query}" if query else "")
        try:
            request = json.loads(body)
        except ValueError:
            await _answer(send, 400, b'{"error": {"message": "body is not JSON"}}')
            return
        self.last_request = request
        delay_s = float(headers.get("x-test-delay-s", 0))
        if delay_s:
            await asyncio.sleep(delay_s)
        chat = scope["path"].endswith("/chat/completions")
        tokens = int(request.get("max_tokens") or 8)
        if request.get("stream"):
            itl_s = float(headers.get("x-test-itl-s", self.itl_s))
            usage = bool((request.get("stream_options") or {}).get("include_usage"))
            per_write = int(headers.get("x-test-events-per-write", 1))
            await self._stream(receive, send, _events(chat, tokens, usage), itl_s, per_write)
        else:
            await _answer(send, 200, json.dumps(_whole(chat, tokens)).encode())
            self.completed += 1

    async def _stream(
        self, receive: Receive, send: Send, events: list[bytes], itl_s: float, per_write: int
    ) -> None:
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.ensure_future(watch())
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        try:
            writes = [b"".join(events[i : i + per_write]) for i in range(0, len(events), per_write)]
            for event in writes:
                if gone.is_set():
                    self.disconnects += 1
                    return
                await send({"type": "http.response.body", "body": event, "more_body": True})
                if itl_s:
                    await asyncio.sleep(itl_s)
            watcher.cancel()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            self.completed += 1
        finally:
            watcher.cancel()


def _events(chat: bool, tokens: int, usage: bool = False) -> list[bytes]:
    created = int(time.time())
    base: dict[str, Any] = {
        "id": "cmpl-test",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": "test-upstream",
    }

    def chunk(choice: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps({**base, "choices": [choice]}).encode() + b"\n\n"

    events = []
    if chat:
        events.append(chunk({"index": 0, "delta": {"role": "assistant", "content": ""}}))
    for index in range(tokens):
        text = f" t{index}"
        events.append(
            chunk(
                {"index": 0, "delta": {"content": text}, "finish_reason": None}
                if chat
                else {"index": 0, "text": text, "finish_reason": None}
            )
        )
    events.append(
        chunk(
            {"index": 0, "delta": {}, "finish_reason": "length"}
            if chat
            else {"index": 0, "text": "", "finish_reason": "length"}
        )
    )
    if usage:  # stream_options.include_usage: a last chunk with no choices, as OpenAI sends it
        counts = {"prompt_tokens": 4, "completion_tokens": tokens, "total_tokens": tokens + 4}
        events.append(
            b"data: " + json.dumps({**base, "choices": [], "usage": counts}).encode() + b"\n\n"
        )
    events.append(b"data: [DONE]\n\n")
    return events


def _whole(chat: bool, tokens: int) -> dict[str, Any]:
    text = "".join(f" t{index}" for index in range(tokens))
    choice: dict[str, Any] = (
        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
        if chat
        else {"index": 0, "text": text, "finish_reason": "length"}
    )
    return {
        "id": "cmpl-test",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": "test-upstream",
        "choices": [choice],
        "usage": {"prompt_tokens": 4, "completion_tokens": tokens, "total_tokens": tokens + 4},
    }


async def _answer(
    send: Send, status: int, body: bytes, content_type: bytes = b"application/json"
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type)],
        }
    )
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--itl-ms", type=float, default=0.0)
    args = parser.parse_args()
    uvicorn.run(
        OpenAIUpstream(args.itl_ms / 1000),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        http="httptools",
        access_log=False,
    )


if __name__ == "__main__":
    main()
