"""`ProxyApp`'s way through one exchange, against a scripted raw HTTP/1.1 upstream on
127.0.0.1: a reused keep-alive connection the upstream closed as the request arrived is retried
once on a fresh one; a retry that fails too answers 502 and leaves no connection open and no
task watching the client; HEAD gets headers and no body, and its connection is not reused; a
body that comes in parts reaches the upstream whole; the request is marked "upstream_connected"
before the upstream can read it.

The ASGI side is driven directly (the client never leaves unless a test says so): a watch task
still pending after the call, or a pool slot still taken, is a leak.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from middleware.clock import SystemClock
from middleware.proxy import ProxyApp
from middleware.request.context import reset_current_timeline, set_current_timeline
from middleware.request.timeline import RequestTimeline
from middleware.types import Message

pytestmark = pytest.mark.integration

OK = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok"


class Cut(bytes):
    """A reply after which the upstream closes the connection."""


# (connection number, request number on it, method, body) -> the reply, or None: close at once.
Script = Callable[[int, int, bytes, bytes], bytes | None]


class ScriptedUpstream:
    """A raw HTTP/1.1 server: reads each request whole (content-length or chunked) and writes
    what the script says, or closes the connection without a byte."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.bodies: list[bytes] = []
        self.request_read_at: list[int] = []  # perf_counter_ns when each request head arrived
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        try:
            for request in range(1, 100):
                head = await reader.readuntil(b"\r\n\r\n")
                self.request_read_at.append(time.perf_counter_ns())
                method = head.split(b" ", 1)[0]
                body = await _read_body(reader, head.lower())
                self.bodies.append(body)
                reply = self.script(number, request, method, body)
                if reply is None:
                    break
                writer.write(reply)
                await writer.drain()
                if isinstance(reply, Cut):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


async def _read_body(reader: asyncio.StreamReader, head: bytes) -> bytes:
    if b"transfer-encoding: chunked" in head:
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                return body
            body += chunk[:-2]
    for line in head.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return await reader.readexactly(int(line.split(b":")[1]))
    return b""


async def call(
    app: ProxyApp, method: str = "POST", parts: tuple[bytes, ...] = (b"{}",)
) -> list[Message]:
    """One request through the app; the client stays connected once its body is sent."""
    sent: list[Message] = []
    pending = [
        {"type": "http.request", "body": part, "more_body": index < len(parts) - 1}
        for index, part in enumerate(parts)
    ]

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        await asyncio.Event().wait()  # the client never leaves
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    scope: dict[str, Any] = {
        "type": "http",
        "method": method,
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000),
    }
    await app(scope, receive, send)
    return sent


async def watching_tasks() -> list[asyncio.Task[Any]]:
    """Tasks still watching a client after the exchange ended (a cancelled one ends at once)."""
    await asyncio.sleep(0)
    return [
        task
        for task in asyncio.all_tasks()
        if not task.done() and getattr(task.get_coro(), "__qualname__", "") == "_ClientGone.watch"
    ]


def status_and_body(sent: list[Message]) -> tuple[int, bytes]:
    assert sent[0]["type"] == "http.response.start", sent
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), timeout=20))


def test_a_reused_connection_closed_by_the_upstream_is_retried_once_on_a_fresh_one() -> None:
    # The first connection answers once, keep-alive, then closes as the next request arrives.
    upstream = ScriptedUpstream(lambda conn, req, method, body: OK if req == 1 else None)

    async def scenario() -> None:
        app = ProxyApp(await upstream.start())
        assert status_and_body(await call(app)) == (200, b"ok")
        assert status_and_body(await call(app)) == (200, b"ok")
        assert upstream.connections == 2  # the retry's fresh connection answered
        assert app.pool.open_connections == 1  # and went back to the pool, the closed one not
        assert await watching_tasks() == []
        app.pool.close()
        await upstream.close()

    run(scenario)


def test_a_retry_that_fails_too_answers_502_and_leaks_nothing() -> None:
    # The kept-alive connection closes as the second request arrives, and the upstream is gone
    # by then: the retry cannot connect.
    upstream = ScriptedUpstream(lambda conn, req, method, body: OK if req == 1 else None)

    async def scenario() -> None:
        app = ProxyApp(await upstream.start())
        assert status_and_body(await call(app)) == (200, b"ok")  # leaves a keep-alive idle
        await upstream.close()  # new connections are refused from now on
        status, body = status_and_body(await call(app))
        assert status == 502 and b"upstream_unreachable" in body, body
        assert app.pool.open_connections == 0
        assert await watching_tasks() == []

    run(scenario)


def test_a_reused_connection_that_broke_after_answering_is_not_retried() -> None:
    # A byte came back before the close: the upstream saw the request, so no second try.
    cut = Cut(b"HTTP/1.1 200 OK\r\n")
    upstream = ScriptedUpstream(lambda conn, req, method, body: OK if req == 1 else cut)

    async def scenario() -> None:
        app = ProxyApp(await upstream.start())
        assert status_and_body(await call(app)) == (200, b"ok")
        status, body = status_and_body(await call(app))
        assert status == 502 and b"upstream_error" in body, body
        assert upstream.connections == 1
        assert app.pool.open_connections == 0
        assert await watching_tasks() == []
        await upstream.close()

    run(scenario)


def test_head_gets_the_headers_and_no_body_and_its_connection_is_dropped() -> None:
    head_reply = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\n\r\n"
    upstream = ScriptedUpstream(lambda conn, req, method, body: head_reply)

    async def scenario() -> None:
        app = ProxyApp(await upstream.start())
        sent = await call(app, "HEAD", (b"",))
        assert status_and_body(sent) == (200, b"")
        assert (b"content-length", b"5") in sent[0]["headers"]
        assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
        assert app.pool.open_connections == 0  # the parser would wait for 5 bytes: not reused
        assert await watching_tasks() == []
        await upstream.close()

    run(scenario)


def test_a_body_in_parts_reaches_the_upstream_whole() -> None:
    upstream = ScriptedUpstream(lambda conn, req, method, body: OK)

    async def scenario() -> None:
        app = ProxyApp(await upstream.start())
        sent = await call(app, parts=(b'{"prompt": ', b"", b'"hi"}'))
        assert status_and_body(sent) == (200, b"ok")
        assert upstream.bodies == [b'{"prompt": "hi"}']
        assert await watching_tasks() == []
        app.pool.close()
        await upstream.close()

    run(scenario)


def test_upstream_connected_is_marked_before_the_upstream_reads_the_request() -> None:
    upstream = ScriptedUpstream(lambda conn, req, method, body: OK)

    async def scenario() -> None:
        app = ProxyApp(await upstream.start())
        timeline = RequestTimeline.begin("r", SystemClock())
        token = set_current_timeline(timeline)
        try:
            assert status_and_body(await call(app)) == (200, b"ok")
        finally:
            reset_current_timeline(token)
        start, connected = timeline.upstream_start_ns, timeline.upstream_connected_ns
        assert start is not None and connected is not None
        assert start <= connected <= upstream.request_read_at[0]
        app.pool.close()
        await upstream.close()

    run(scenario)
