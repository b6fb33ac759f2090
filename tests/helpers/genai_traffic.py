"""Traffic for the GenAI-convention tests: the OpenAI-style upstream of the proxy tests behind
the middleware, with a server error on demand (`x-test-fail: 1` answers 500), driven in
process through httpx's ASGI transport (so the scope has a `server` address and port).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx

from middleware.types import Receive, Scope, Send
from tests.helpers.proxy_upstream import OpenAIUpstream

MODEL = "test-upstream"  # the model the upstream answers with
SERVER = ("127.0.0.1", 8000)

# (route, body, headers, failed): an ok stream, an ok plain answer, a server error.
REQUESTS: list[tuple[str, dict[str, Any], dict[str, str], bool]] = [
    (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 5,
            "temperature": 0.5,
            "top_p": 0.9,
        },
        {},
        False,
    ),
    (
        "/v1/completions",
        {"model": MODEL, "prompt": "hi", "max_tokens": 3, "n": 2, "seed": 7},
        {},
        False,
    ),
    (
        "/v1/completions",
        {"model": MODEL, "prompt": "hi", "max_tokens": 3},
        {"x-test-fail": "1"},
        True,
    ),
]


def failing_upstream() -> Callable[[Scope, Receive, Send], Any]:
    """OpenAIUpstream, except that a request with `x-test-fail: 1` gets a 500."""
    upstream = OpenAIUpstream()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if (b"x-test-fail", b"1") not in scope.get("headers", ()):
            await upstream(scope, receive, send)
            return
        while (await receive()).get("more_body", False):
            pass
        body = json.dumps({"error": {"message": "engine failed", "type": "server_error"}})
        await send({"type": "http.response.start", "status": 500,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": body.encode()})

    return app


async def send_requests(
    app: Any, requests: list[tuple[str, dict[str, Any], dict[str, str], bool]] = REQUESTS
) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app)
    base_url = f"http://{SERVER[0]}:{SERVER[1]}"
    answers = []
    async with httpx.AsyncClient(transport=transport, base_url=base_url) as client:
        for route, body, headers, _ in requests:
            answers.append(await client.post(route, json=body, headers=headers))
    return answers


async def scrape(app: Any) -> str:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as client:
        return (await client.get("/metrics")).text
