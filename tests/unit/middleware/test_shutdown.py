"""The middleware's half of ASGI lifespan (middleware/lifespan.py) against the spec, the signal
hook for servers without lifespan, and records added after the store closed.

The real servers are in tests/integration/test_shutdown_servers.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from middleware import lifespan as lifespan_module
from middleware.lifespan import Lifespan
from middleware.types import Message, Receive, Scope, Send
from slo.store import RecordStore
from tests.helpers.record_samples import sample_records

App = Callable[[Scope, Receive, Send], Any]


class Server:
    """The server's side of one lifespan conversation; it logs the shutdown flush in `events`."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.events: list[str] = []
        self.lifespan = Lifespan(lambda: self.events.append("flush"))

    async def receive(self) -> Message:
        message = await self.inbox.get()
        self.events.append(f"got {message['type']}")
        return message

    async def send(self, message: Message) -> None:
        self.events.append(message["type"])

    async def run(self, app: App, *, shutdown: bool = True) -> None:
        """Start the app's lifespan, then (like a server that is stopped) shut it down."""
        task = asyncio.create_task(
            self.lifespan.run(app, {"type": "lifespan"}, self.receive, self.send)
        )
        await self.inbox.put({"type": "lifespan.startup"})
        for _ in range(20):
            await asyncio.sleep(0)
        if shutdown:
            await self.inbox.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(task, timeout=10)


def talk(app: App, *, shutdown: bool = True) -> Server:
    async def main() -> Server:
        server = Server()
        await server.run(app, shutdown=shutdown)
        return server

    return asyncio.run(main())


async def full_app(scope: Scope, receive: Receive, send: Send) -> None:
    assert (await receive())["type"] == "lifespan.startup"
    await send({"type": "lifespan.startup.complete"})
    assert (await receive())["type"] == "lifespan.shutdown"
    await send({"type": "lifespan.shutdown.complete"})


def test_startup_and_shutdown_pass_through_and_the_flush_comes_before_the_server_hears() -> None:
    server = talk(full_app)
    assert server.events == [
        "got lifespan.startup",
        "lifespan.startup.complete",
        "got lifespan.shutdown",
        "flush",
        "lifespan.shutdown.complete",
    ]


def test_shutdown_failed_still_flushes_first() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "lifespan.startup.complete"})
        await receive()
        await send({"type": "lifespan.shutdown.failed", "message": "pool stuck"})

    assert talk(app).events[-2:] == ["flush", "lifespan.shutdown.failed"]


async def raises_at_once(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError("http only")


async def returns_at_once(scope: Scope, receive: Receive, send: Send) -> None:
    return None


@pytest.mark.parametrize("app", [raises_at_once, returns_at_once])
def test_an_app_without_lifespan_gets_the_protocol_answered(app: App) -> None:
    server = talk(app)
    assert server.events == [
        "got lifespan.startup",
        "lifespan.startup.complete",
        "got lifespan.shutdown",
        "flush",
        "lifespan.shutdown.complete",
    ]
    assert server.lifespan.closed


def test_startup_failed_flushes_and_waits_for_no_shutdown() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "no GPU"})

    server = talk(app, shutdown=False)  # the server exits: it sends no shutdown
    assert server.events == ["got lifespan.startup", "flush", "lifespan.startup.failed"]


def test_an_app_that_ends_its_lifespan_after_startup_still_gets_the_flush_at_shutdown() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "lifespan.startup.complete"})

    server = talk(app)
    assert server.events == [
        "got lifespan.startup",
        "lifespan.startup.complete",
        "got lifespan.shutdown",
        "flush",
        "lifespan.shutdown.complete",
    ]


def test_an_app_that_crashes_after_startup_keeps_the_servers_lifespan(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "lifespan.startup.complete"})
        raise RuntimeError("background task died")

    server = talk(app)
    assert server.events[-2:] == ["flush", "lifespan.shutdown.complete"]
    assert "raised after startup" in caplog.text


def test_a_crash_in_the_apps_shutdown_flushes_then_reaches_the_server() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "lifespan.startup.complete"})
        await receive()
        raise RuntimeError("shutdown hook failed")

    with pytest.raises(RuntimeError, match="shutdown hook failed"):
        talk(app)


def test_a_crashed_startup_is_the_servers_to_judge_and_the_signal_hook_takes_over() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        raise RuntimeError("cannot load the model")

    async def main() -> Lifespan:
        server = Server()
        with pytest.raises(RuntimeError, match="cannot load the model"):
            await server.run(app, shutdown=False)
        return server.lifespan

    lifespan = asyncio.run(main())
    assert not lifespan.seen and not lifespan.closed  # saw_request() hooks exit and signals


def test_close_runs_once_even_when_callers_race() -> None:
    calls: list[int] = []
    started = threading.Event()
    release = threading.Event()

    def slow_flush() -> None:
        calls.append(1)
        started.set()
        release.wait(5)

    lifespan = Lifespan(slow_flush)
    first = threading.Thread(target=lifespan.close)
    first.start()
    started.wait(5)
    second = threading.Thread(target=lifespan.close)
    second.start()
    second.join(0.05)
    assert second.is_alive()  # it waits for the first flush instead of returning early
    release.set()
    first.join(5)
    second.join(5)
    lifespan.close()
    assert calls == [1] and lifespan.closed


def test_without_lifespan_a_signal_flushes_on_the_loop_and_chains_the_servers_handler() -> None:
    """The hook as uvicorn meets it: its handler is in place before the first request."""
    server_saw: list[int] = []
    flushed: list[bool] = []
    original = signal.getsignal(signal.SIGTERM)

    def server_handler(signum: int, frame: FrameType | None) -> None:
        server_saw.append(signum)

    async def main() -> None:
        lifespan = Lifespan(lambda: flushed.append(True))
        lifespan.saw_request()  # no lifespan ran: the hook goes in
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):
            if flushed:
                break
            await asyncio.sleep(0.01)
        assert lifespan.closed

    signal.signal(signal.SIGTERM, server_handler)
    try:
        asyncio.run(main())
    finally:
        signal.signal(signal.SIGTERM, original)
        lifespan_module._previous.clear()
    assert server_saw == [signal.SIGTERM] and flushed == [True]


def test_a_record_added_after_close_is_written_before_add_returns(tmp_path: Path) -> None:
    db = tmp_path / "records.db"
    store = RecordStore(f"sqlite:///{db}", flush_interval_s=60)
    first, late = sample_records(2)
    store.add(first)
    store.close()
    store.add(late)  # a request that finished during the server's drain
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT count(*) FROM llm_slo_request_records").fetchone() == (2,)
    store.engine.dispose()
    assert not list(tmp_path.glob("llm-slo-spool-*"))
