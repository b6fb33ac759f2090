"""The middleware's part in ASGI lifespan: on shutdown every record is flushed and the
background threads stop, whatever server runs the app.

- The app's own lifespan runs as before (startup and shutdown pass through); the flush runs
  just before the app's `lifespan.shutdown.complete` (or `.failed`) reaches the server, and
  when the app reports `lifespan.startup.failed` (the server then stops without a shutdown).
- An app that does not speak lifespan (it raises before reading a message, or returns without
  answering) gets the protocol answered for it, so the server still tells the middleware when
  it stops. An app that ends its lifespan early keeps the middleware's half going.
- A server that never runs lifespan (`uvicorn --lifespan off`, a startup that raised) gets a
  signal hook at the first request: uvicorn re-raises SIGTERM with the default action after its
  graceful drain, so atexit never runs. On SIGTERM/SIGINT the store is flushed from the event
  loop, and records of the requests that finish during the drain are written before
  `RecordStore.add` returns (`slo/store/writer.py`). atexit covers the rest (SIGINT's
  KeyboardInterrupt, a plain exit).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import signal
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from middleware.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("middleware")

SignalHandler = Callable[[int, FrameType | None], Any] | int | None

FLUSH_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass
class _Progress:
    """How far one lifespan conversation between the server and the app has come."""

    startup_received: bool = False
    startup_answered: bool = False
    startup_failed: bool = False
    shutdown_received: bool = False
    shutdown_answered: bool = False


class Lifespan:
    def __init__(
        self,
        on_shutdown: Callable[[], None],
        *,
        before_close: Callable[[], None] | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> None:
        self._on_shutdown = on_shutdown
        self._before_close = before_close  # on the event loop, before `on_shutdown` off it
        # On the event loop that serves the requests, when lifespan starts (or, without
        # lifespan, at the first request): what needs that loop (the OTLP/gRPC intake) takes it.
        self._on_start = on_start
        self.seen = False  # a lifespan is running that will tell us of the shutdown
        self.closed = False
        self._close_lock = threading.Lock()  # lifespan, signal and atexit may race to close
        self._fallback = False

    async def run(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        if self.closed:
            logger.warning(
                "llm-slo: lifespan starts again after this middleware shut down: records are "
                "now written one by one; give each server run its own LatencyMiddleware"
            )
        self.seen = True
        if self._on_start is not None:
            self._on_start()
        progress = _Progress()

        async def receive_wrapper() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                progress.startup_received = True
            elif message["type"] == "lifespan.shutdown":
                progress.shutdown_received = True
            return message

        async def send_wrapper(message: Message) -> None:
            kind = message["type"]
            if kind in ("lifespan.startup.complete", "lifespan.startup.failed"):
                progress.startup_answered = True
                if kind == "lifespan.startup.failed":
                    # The server exits without a shutdown message: nothing else will flush.
                    progress.startup_failed = True
                    await self.shutdown()
            elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                progress.shutdown_answered = True
                await self.shutdown()  # before the server hears it: it may exit right after
            await send(message)

        try:
            await app(scope, receive_wrapper, send_wrapper)
        except Exception:
            if progress.startup_failed or progress.shutdown_answered:
                raise
            if progress.shutdown_received:
                await self.shutdown()  # the app's shutdown crashed: flush, let the server report
                raise
            if progress.startup_received and not progress.startup_answered:
                # A startup that crashed (or an app that read the message and then refused
                # lifespan): the server decides, as it would without us; `saw_request` hooks
                # the signals since no shutdown message will come.
                self.seen = False
                raise
            if progress.startup_answered:
                logger.exception(
                    "llm-slo: the app's lifespan raised after startup; the middleware keeps "
                    "the server's lifespan so that records are flushed at shutdown"
                )
            else:
                logger.debug("llm-slo: the app does not support lifespan; the middleware answers")
        if progress.startup_failed or progress.shutdown_answered:
            return
        await self._finish(receive, send, progress)

    async def _finish(self, receive: Receive, send: Send, progress: _Progress) -> None:
        """Carry on the conversation the app left: startup answered, flush at shutdown."""
        if not progress.startup_answered:
            if not progress.startup_received:
                await receive()
            await send({"type": "lifespan.startup.complete"})
        if not progress.shutdown_received:
            while (await receive())["type"] != "lifespan.shutdown":
                pass
        await self.shutdown()
        await send({"type": "lifespan.shutdown.complete"})

    async def shutdown(self) -> None:
        """Flush records and stop threads (off the event loop: it may wait on the disk)."""
        if not self.closed:
            if self._before_close is not None:
                self._before_close()
            await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Flush and stop once; a second caller waits for the first to finish."""
        with self._close_lock:
            if self.closed:
                return
            try:
                self._on_shutdown()
            finally:
                self.closed = True

    def saw_request(self) -> None:
        """A request came in: a server that never ran lifespan gets the flush another way."""
        if self.seen or self._fallback:
            return
        self._fallback = True
        if self._on_start is not None:
            self._on_start()
        _without_lifespan.add(self)
        _hook_exit()


# --- servers without lifespan: one process-wide hook, whatever the number of middlewares -------

_without_lifespan: weakref.WeakSet[Lifespan] = weakref.WeakSet()
_previous: dict[int, SignalHandler] = {}  # the handler each of our signal hooks chains to
_hook_lock = threading.Lock()
_main_loop: asyncio.AbstractEventLoop | None = None
_atexit_registered = False


def _hook_exit() -> None:
    """atexit once per process, and SIGTERM/SIGINT chained from the main thread (the only one
    that may set signals; the event loop of every common server runs there)."""
    global _atexit_registered, _main_loop
    with _hook_lock:
        if not _atexit_registered:
            atexit.register(_close_all)
            _atexit_registered = True
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            _main_loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside a request: no loop to flush on
            return
        for signum in FLUSH_SIGNALS:
            current = signal.getsignal(signum)
            if current is _on_signal or current is signal.SIG_IGN or current is None:
                continue  # ours already, ignored, or set outside Python: leave it
            _previous[signum] = current
            signal.signal(signum, _on_signal)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    previous = _previous.get(signum, signal.SIG_DFL)
    default = previous is signal.SIG_DFL
    if any(not lifespan.closed for lifespan in list(_without_lifespan)):
        loop = _main_loop
        if loop is not None and loop.is_running():
            # The handler may have stopped this thread inside `RecordStore.add`, holding the
            # queue's lock: the flush runs at the loop's next turn, where no add is halfway.
            loop.call_soon_threadsafe(_close_all, signum if default else None)
            if default:
                return  # the callback ends the process after the flush
        else:
            _close_all()  # no loop turns any more: nothing on this thread is writing
    if default:
        _die(signum)
    elif callable(previous):
        previous(signum, frame)


def _close_all(die_by: int | None = None) -> None:
    # On the loop, blocking it is the point: the server must not finish its drain and re-raise
    # the signal before the queued records are in; later records are written by add().
    for lifespan in list(_without_lifespan):
        try:
            lifespan.close()
        except Exception:
            logger.exception("llm-slo: flushing records at shutdown failed")
    if die_by is not None:
        _die(die_by)  # nobody else handles the signal: end as its default action would


def _die(signum: int) -> None:
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)
