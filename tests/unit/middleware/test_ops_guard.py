"""OpsGuard, rule by rule, on the ASGI level: which paths it guards, the header, the page's
token-once redirect and its cookie, what the cookie does not open, and what passes through."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from middleware.ops_guard import COOKIE, OpsGuard
from middleware.types import Message, Receive, Scope, Send

TOKEN = "s3cret-token"


async def _inner(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"inner"})


def call(
    path: str,
    headers: list[tuple[bytes, bytes]] | None = None,
    method: str = "GET",
    query: bytes = b"",
    scheme: str = "http",
) -> tuple[int, dict[bytes, bytes]]:
    guard = OpsGuard(_inner, TOKEN)
    scope: dict[str, Any] = {
        "type": "http",
        "path": path,
        "method": method,
        "headers": headers or [],
        "query_string": query,
        "scheme": scheme,
    }
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(guard(scope, receive, send))
    start = sent[0]
    return start["status"], dict(start["headers"])


@pytest.mark.parametrize("path", ["/metrics", "/slo", "/slo.html", "/v1/traces"])
def test_guarded_paths_need_the_bearer_token(path: str) -> None:
    method = "POST" if path == "/v1/traces" else "GET"
    assert call(path, method=method)[0] == 401
    assert call(path, [(b"authorization", b"Bearer nope")], method)[0] == 401
    assert call(path, [(b"authorization", b"Basic " + TOKEN.encode())], method)[0] == 401
    assert call(path, [(b"authorization", b"Bearer " + TOKEN.encode())], method)[0] == 200
    assert call(path, [(b"Authorization", b"bearer " + TOKEN.encode())], method)[0] == 200


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/health", "/metrics/", "/slo.json"])
def test_other_paths_pass_through(path: str) -> None:
    assert call(path)[0] == 200


def test_the_page_token_once_sets_a_cookie_and_drops_the_token_from_the_url() -> None:
    status, headers = call("/slo.html", query=f"range=6h&token={TOKEN}".encode(), scheme="https")
    assert status == 303
    assert headers[b"location"] == b"/slo.html?range=6h"
    cookie = headers[b"set-cookie"].decode()
    assert cookie.startswith(f"{COOKIE}=")
    for attribute in ("HttpOnly", "SameSite=Strict", "Secure", "Path=/", "Max-Age="):
        assert attribute in cookie
    assert TOKEN not in cookie  # an HMAC of it: a leaked cookie does not leak the token
    value = cookie.split(";")[0].encode()
    assert call("/slo.html", [(b"cookie", b"other=1; " + value)])[0] == 200
    assert call("/slo", [(b"cookie", value)])[0] == 200
    assert call("/metrics", [(b"cookie", value)])[0] == 200
    assert call("/v1/traces", [(b"cookie", value)], method="POST")[0] == 401  # not the intake
    assert call("/slo", [(b"cookie", value)], method="POST")[0] == 401  # GET and HEAD only


def test_no_secure_attribute_over_plain_http_and_wrong_tokens_get_nothing() -> None:
    status, headers = call("/slo.html", query=f"token={TOKEN}".encode())
    assert status == 303 and b"Secure" not in headers[b"set-cookie"]
    assert call("/slo.html", query=b"token=guess")[0] == 401
    assert call("/slo", query=f"token={TOKEN}".encode())[0] == 401  # only the page takes ?token
    assert call("/slo.html", [(b"cookie", f"{COOKIE}=forged".encode())])[0] == 401


def test_non_http_scopes_pass_through() -> None:
    seen: list[str] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    async def nothing() -> Message:
        return {}

    async def ignore(message: Message) -> None:
        return None

    asyncio.run(OpsGuard(inner, TOKEN)({"type": "lifespan"}, nothing, ignore))
    assert seen == ["lifespan"]


def test_an_empty_token_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="empty"):
        OpsGuard(_inner, "")
