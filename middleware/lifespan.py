"""The middleware's part in ASGI lifespan: on shutdown every record is flushed and the
background threads stop, whatever server runs the app.

- The app's own lifespan runs as before (startup and shutdown pass through); the flush runs
  just before the app's `lifespan.shutdown.complete` reaches the server.
- An app that does not speak lifespan (it raises on the scope) gets the protocol answered
  for it, so the server still tells the middleware when it stops.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
from collections.abc import Callable

from middleware.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("middleware")


class Lifespan:
    def __init__(self, on_shutdown: Callable[[], None]) -> None:
        self._on_shutdown = on_shutdown
        self.seen = False
        self.closed = False
        self._fallback = False

    async def run(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        self.seen = True
        startup_received = False
        answered = False

        async def receive_wrapper() -> Message:
            nonlocal startup_received
            message = await receive()
            if message["type"] == "lifespan.startup":
                startup_received = True
            return message

        async def send_wrapper(message: Message) -> None:
            nonlocal answered
            kind = message["type"]
            if kind.startswith("lifespan.startup."):
                answered = True
            elif kind.startswith("lifespan.shutdown."):
                await self.shutdown()
            await send(message)

        try:
            await app(scope, receive_wrapper, send_wrapper)
        except Exception:
            if answered:
                raise
            logger.debug("llm-slo: the app does not support lifespan; the middleware answers")
        else:
            if answered:
                return
        await self._answer(receive, send, startup_received)

    async def _answer(self, receive: Receive, send: Send, startup_received: bool) -> None:
        """Speak lifespan for an app that does not: ready at once, flush on shutdown."""
        if not startup_received:
            await receive()
        await send({"type": "lifespan.startup.complete"})
        while (await receive())["type"] != "lifespan.shutdown":
            pass
        await self.shutdown()
        await send({"type": "lifespan.shutdown.complete"})

    async def shutdown(self) -> None:
        """Flush records and stop threads (off the event loop: it may wait on the disk)."""
        if self.closed:
            return
        self.closed = True
        await asyncio.to_thread(self._on_shutdown)

    def saw_request(self) -> None:
        """A request came in: a server that never ran lifespan gets the flush at exit."""
        if self.seen or self._fallback:
            return
        self._fallback = True
        atexit.register(self._close_at_exit)

    def _close_at_exit(self) -> None:
        if not self.closed:
            self.closed = True
            self._on_shutdown()
