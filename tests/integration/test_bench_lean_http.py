"""`slo bench`'s lean HTTP/1.1 client against real servers on 127.0.0.1: what `measure`
makes of a reply is the same through it as through httpx; connections are reused, a
connection the server closed while idle is replaced without losing the request, and
timeouts, refusals and broken replies raise httpx's exceptions."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from slo.cli.bench import runner
from slo.cli.bench.client import RequestSettings, measure
from slo.cli.bench.lean_http import LeanClient
from slo.cli.bench.profiles import PlannedRequest
from slo.cli.bench.server import free_port
from tests.helpers.servers import uvicorn_thread

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PLANNED = PlannedRequest(0, "premium", "hello", 4, 3, 0.0)


def _chunk(text: str | None, usage: dict[str, int] | None = None) -> bytes:
    choices = [] if text is None else [{"index": 0, "delta": {"content": text}}]
    body: dict[str, Any] = {"choices": choices}
    if usage:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def _chat(request: Request) -> Response:
    body = await request.json()
    ports.append(request.client.port if request.client else 0)
    if request.headers.get("x-llm-tier") == "slow":
        await asyncio.sleep(5)
    if request.headers.get("x-llm-tier") == "refused":
        return JSONResponse({"error": {"message": "no such tier"}}, status_code=400)
    if not body.get("stream"):
        usage = {"prompt_tokens": 4, "completion_tokens": 3}
        return JSONResponse({"choices": [{"message": {"content": "a b c"}}], "usage": usage},
                            headers={"server-timing": "e2e;dur=12.5, ttft;dur=3"})  # fmt: skip

    async def events() -> AsyncIterator[bytes]:
        for text in ("a", "b", "c"):
            await asyncio.sleep(0.01)
            yield _chunk(text)
        yield _chunk(None, {"prompt_tokens": 4, "completion_tokens": 3})
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def _health(_: Request) -> Response:
    return JSONResponse({"status": "ok"})


ports: list[int] = []
APP = Starlette(routes=[Route("/v1/chat/completions", _chat, methods=["POST"]),
                        Route("/health", _health)])  # fmt: skip


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with uvicorn_thread(APP) as base_url:
        yield base_url


def _both(url: str, settings: RequestSettings, tier: str = "premium") -> list[Any]:
    planned = PlannedRequest(0, tier, "hello", 4, 3, 0.0)

    async def run() -> list[Any]:
        lean = LeanClient(url)
        async with httpx.AsyncClient() as client:
            found = [await measure(lean, url, planned, settings),
                     await measure(client, url, planned, settings)]  # fmt: skip
        await lean.aclose()
        return found

    return asyncio.run(run())


@pytest.mark.parametrize("stream", [True, False])
def test_measure_makes_the_same_of_a_reply_through_either_client(url: str, stream: bool) -> None:
    lean, reference = _both(url, RequestSettings("m", "chat", stream=stream))
    for field in ("status", "outcome", "error", "prompt_tokens", "completion_tokens",
                  "text_chunks", "server"):  # fmt: skip
        assert getattr(lean, field) == getattr(reference, field), field
    assert lean.status == 200 and lean.completion_tokens == 3
    if stream:
        assert lean.ttft_s is not None and len(lean.itl_s) == 2
    else:
        assert lean.server["e2e_s"] == pytest.approx(0.0125)


def test_an_error_reply_is_the_same_outcome_through_either_client(url: str) -> None:
    lean, reference = _both(url, RequestSettings("m", "chat"), tier="refused")
    assert (lean.status, lean.outcome, lean.error) == (400, "client_error", "no such tier")
    assert (reference.status, reference.outcome, reference.error) == (400, "client_error",
                                                                      "no such tier")  # fmt: skip


def test_connections_are_reused(url: str) -> None:
    async def run() -> None:
        lean = LeanClient(url)
        for _ in range(5):
            await measure(lean, url, PLANNED, RequestSettings("m", "chat"))
        await lean.aclose()

    ports.clear()
    asyncio.run(run())
    # one at a time: the connection in use and, at most, the spare opened beside it
    assert len(ports) == 5 and len(set(ports)) <= 2, ports


def test_a_host_name_reaches_a_server_on_whichever_address_answers(url: str) -> None:
    """`localhost` may resolve to ::1 first; the server listens on 127.0.0.1 only."""
    base = "http://localhost:" + url.rsplit(":", 1)[1]

    async def run() -> Any:
        lean = LeanClient(base)
        try:
            return await measure(lean, base, PLANNED, RequestSettings("m", "chat"))
        finally:
            await lean.aclose()

    result = asyncio.run(run())
    assert (result.status, result.outcome, result.error) == (200, "ok", None)


def test_a_slow_reply_times_out_as_httpx_does(url: str) -> None:
    settings = RequestSettings("m", "chat", timeout_s=0.3)
    (lean,) = _both(url, settings, tier="slow")[:1]
    assert lean.outcome == "timeout" and "timed out" in (lean.error or "")


@contextlib.asynccontextmanager
async def _closing_server(reply: bytes) -> AsyncIterator[str]:
    """A raw server that answers each connection's first request with `reply`, then closes
    the connection (without saying so): what an idle keep-alive timeout does."""
    served: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:  # a spare connection the client closed unused
            writer.close()
            return
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        served.append(1)
        writer.write(reply)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", free_port())
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}"
        await asyncio.sleep(0.1)  # the handlers see the client's closes and close their side


def test_a_connection_closed_while_idle_is_replaced_and_the_request_sent_again() -> None:
    body = b'{"choices":[{"message":{"content":"ok"}}]}'
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    settings = RequestSettings("m", "chat", stream=False)

    async def run() -> list[Any]:
        async with _closing_server(reply) as base:
            lean = LeanClient(base)
            results = [await measure(lean, base, PLANNED, settings) for _ in range(3)]
            await lean.aclose()
            return results

    for result in asyncio.run(run()):
        assert (result.status, result.outcome, result.error) == (200, "ok", None)


def test_broken_replies_and_refusals_are_server_errors() -> None:
    settings = RequestSettings("m", "chat", stream=False)

    async def run() -> list[Any]:
        async with _closing_server(b"SMTP ready\r\n\r\n") as base:
            client = LeanClient(base)
            broken = await measure(client, base, PLANNED, settings)
            await client.aclose()
        refused_at = f"http://127.0.0.1:{free_port()}"
        client = LeanClient(refused_at)
        refused = await measure(client, refused_at, PLANNED, settings)
        await client.aclose()
        return [broken, refused]

    broken, refused = asyncio.run(run())
    assert broken.outcome == "server_error" and "status line" in (broken.error or "")
    assert refused.outcome == "server_error" and "ConnectError" in (refused.error or "")


def test_the_runner_sends_plain_http_through_the_lean_client_and_https_through_httpx() -> None:
    async def kinds() -> list[type]:
        found = []
        for base in ("http://127.0.0.1:9", "https://127.0.0.1:9"):
            async with runner._client(base, 5.0, None) as client:
                found.append(type(client))
        return found

    assert asyncio.run(kinds()) == [LeanClient, httpx.AsyncClient]
    with pytest.raises(ValueError, match="http:// URLs"):
        LeanClient("https://example.test")
