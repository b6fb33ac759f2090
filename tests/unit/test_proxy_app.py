"""`ProxyApp` (middleware.proxy) on upstream connections fed by hand: a request that finds a
kept-alive connection is written before anything else is started (the way to the first token),
and a client that leaves while its request waits for a connection is never forwarded."""

from __future__ import annotations

import asyncio
from typing import Any

from middleware.proxy import ProxyApp
from middleware.proxy.client import UpstreamConnection, UpstreamPool

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
EVENT = b"data: {}\n\n"
END = b"%x\r\n%s\r\n0\r\n\r\n" % (len(EVENT), EVENT)


class _Transport:
    """The upstream socket's writing side: what was written, in order, with `log`."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.requests: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.log.append("upstream write")
        self.requests.append(data)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def abort(self) -> None:
        pass


class _HandFedPool(UpstreamPool):
    """A real pool whose new connections are fed by hand instead of a socket."""

    def __init__(self, log: list[str], max_connections: int) -> None:
        super().__init__("upstream.test", 80, max_connections=max_connections)
        self.log = log
        self.made: list[UpstreamConnection] = []

    async def _connect(self) -> UpstreamConnection:
        await asyncio.sleep(0)  # connecting takes a while: others run meanwhile
        connection = UpstreamConnection(asyncio.get_running_loop(), read_timeout_s=30)
        connection.connection_made(_Transport(self.log))  # type: ignore[arg-type]
        self.made.append(connection)
        return connection


def _proxy(log: list[str], max_connections: int = 1) -> tuple[ProxyApp, _HandFedPool]:
    app = ProxyApp("http://upstream.test")
    app.pool = pool = _HandFedPool(log, max_connections)
    return app, pool


def _scope() -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
    }


class _Client:
    """A client's side of one request: its body, then nothing until it is told to leave."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name
        self.body_sent = False
        self.leave = asyncio.Event()
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        if not self.body_sent:
            self.body_sent = True
            return {"type": "http.request", "body": b"{}", "more_body": False}
        self.log.append(f"{self.name} watched")
        await self.leave.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)


async def _until(condition: Any) -> None:
    for _ in range(100):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the proxy did not get there")


def test_the_client_is_watched_from_before_a_wait_for_a_connection_else_from_the_write() -> None:
    async def run() -> list[str]:
        log: list[str] = []
        app, pool = _proxy(log)
        for written, name in enumerate(("first", "second"), 1):  # connects; reuses the first's
            client = _Client(log, name)
            task = asyncio.ensure_future(app(_scope(), client.receive, client.send))
            await _until(lambda: log.count("upstream write") == written)  # noqa: B023
            (connection,) = pool.made
            connection.data_received(HEAD + END)
            await asyncio.wait_for(task, 5)
            assert [m.get("body") for m in client.sent][-2:] == [EVENT, b""]
        return log

    log = asyncio.run(run())
    # the first had to connect (a wait): watched from before it; the second: from its write
    assert log == ["first watched", "upstream write", "upstream write", "second watched"]


def test_a_client_that_leaves_while_waiting_for_a_connection_is_never_forwarded() -> None:
    async def run() -> tuple[list[bytes], list[dict[str, Any]]]:
        log: list[str] = []
        app, pool = _proxy(log, max_connections=1)
        first, second = _Client(log, "first"), _Client(log, "second")
        holding = asyncio.ensure_future(app(_scope(), first.receive, first.send))
        await _until(lambda: "upstream write" in log)
        (connection,) = pool.made
        connection.data_received(HEAD)  # the first's stream is under way: the slot is taken
        waiting = asyncio.ensure_future(app(_scope(), second.receive, second.send))
        await _until(lambda: "second watched" in log)  # waiting for the slot, watched
        second.leave.set()
        await asyncio.sleep(0)
        connection.data_received(END)  # the first ends: its connection would go to the second
        await asyncio.wait_for(asyncio.gather(holding, waiting), 5)
        return connection.transport.requests, second.sent  # type: ignore[union-attr]

    requests, second_sent = asyncio.run(run())
    assert len(requests) == 1  # the second request never reached the upstream
    assert second_sent == []  # nothing was answered: the middleware records it as cancelled
