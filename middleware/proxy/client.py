"""A lean HTTP/1.1 client for `slo proxy`: keep-alive connections to one upstream, parsed in C.

Chosen by measurement (see docs/proxy.md): httpx parses HTTP/1.1 in pure
Python (h11) and pays for it on every streamed chunk; aiohttp has a C parser but wraps each
chunk in its own stream and task machinery. Here each connection is an `asyncio.Protocol` fed
straight into httptools (llhttp, the parser uvicorn uses), and a body piece reaches the proxy
through one deque append and one future: a few microseconds per chunk.

One `UpstreamPool` per upstream: at most `max_connections` open at once (callers beyond that
wait, bounded by the connect timeout), idle ones kept alive and reused newest first, any that
the upstream closed while idle dropped as soon as the close arrives.
"""

from __future__ import annotations

import asyncio
import collections
import ssl as ssl_module
from collections.abc import Callable
from typing import Any

import httptools

# Pause reading from the upstream while this many body bytes wait for a slow client.
_HIGH_WATER = 256 * 1024
_END = object()  # the response is complete


class UpstreamError(Exception):
    """The upstream could not be reached or broke off. `kind` decides the answer:
    "unreachable" (502), "timeout" (504), "broken" (502: closed or garbled mid-response),
    "untrusted" (502: its TLS certificate cannot be verified), "tls" (502: handshake failed)."""

    def __init__(self, kind: str, message: str, *, sent_nothing: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        # True when no response byte arrived on a reused connection: safe to retry once.
        self.sent_nothing = sent_nothing


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection; serves one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout_s: float) -> None:
        self._loop = loop
        self._read_timeout_s = read_timeout_s
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self._parser = httptools.HttpResponseParser(self)
        self._start_request()

    def _start_request(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.keep_alive = False
        self._events: collections.deque[Any] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._error: UpstreamError | None = None
        self._buffered = 0
        self._paused = False
        self._active = False
        self._received_any = False
        self._last_data_at = 0.0
        self._timer: asyncio.TimerHandle | None = None
        # Where body pieces go as they arrive, past the task (`middleware.wire.direct_body`): the
        # client's socket, when the server offers it; returns False when it cannot take one.
        self.sink: Callable[[bytes], bool] | None = None
        self._holding = False  # `read` handed out a piece the proxy has not sent yet

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self._active:  # bytes nobody asked for: the connection cannot be trusted
            self.abort()
            return
        self._received_any = True
        self._last_data_at = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamError("broken", "upstream switched protocols, which is not proxied"))
        except httptools.HttpParserError as error:
            self._fail(UpstreamError("broken", f"upstream sent malformed HTTP ({error})"))

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self._active:
            return
        if self.headers_done and not self._framed():
            self.keep_alive = False
            self._push(_END)  # a body delimited by the close: that close is its end
        else:
            self._fail(
                UpstreamError(
                    "broken",
                    "upstream closed the connection before the response was complete",
                    sent_nothing=self.reused and not self._received_any,
                )
            )

    # -- httptools callbacks ---------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        sink = self.sink
        # Straight to the client unless pieces wait for the task (their order comes first).
        if sink is not None and not self._events and not self._holding and sink(body):
            return
        self._events.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.keep_alive = self._parser.should_keep_alive()
        self._push(_END)

    # -- the proxy's side ------------------------------------------------------------------
    def send_request(self, data: bytes) -> None:
        """Start a request: `data` is its head and (all or the first part of) its body."""
        self._start_request()
        self._active = True
        self._last_data_at = self._loop.time()
        assert self.transport is not None
        self.transport.write(data)
        self._timer = self._loop.call_at(self._last_data_at + self._read_timeout_s, self._check)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    async def response_headers(self) -> None:
        """Wait for the status line and headers (raises UpstreamError)."""
        while not self.headers_done:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def read(self) -> bytes | None:
        """The next body piece as it arrived, or None at the end (raises UpstreamError)."""
        events = self._events
        self._holding = False  # the piece handed out before was sent
        while not events:
            if self._error is not None:
                raise self._error
            if self._paused:
                self._paused = False
                self._buffered = 0
                if self.transport is not None:
                    self.transport.resume_reading()
            await self._wait()
        event = events.popleft()
        if event is _END:
            self._finish()
            return None
        self._holding = True
        return event  # type: ignore[no-any-return]

    def abort(self) -> None:
        """Drop the connection now (the upstream sees the close and can stop generating)."""
        self.closed = True
        self.keep_alive = False
        if self.transport is not None:
            self.transport.abort()

    @property
    def reusable(self) -> bool:
        return self.keep_alive and not self.closed and not self._active

    # -- internals -------------------------------------------------------------------------
    def _framed(self) -> bool:
        for name, value in self.headers:
            if name == b"content-length" or (
                name == b"transfer-encoding" and b"chunked" in value.lower()
            ):
                return True
        return False

    async def _wait(self) -> None:
        waiter = self._loop.create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _push(self, event: Any) -> None:
        self._events.append(event)
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None:
            self._error = error
        self.abort()
        self._wake()

    def _finish(self) -> None:
        self._active = False
        self.sink = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        """The read timeout: the upstream was silent for read_timeout_s (checked lazily, so
        a chunk costs one clock read, not a timer)."""
        self._timer = None
        if not self._active:
            return
        now = self._loop.time()
        silent_since = self._last_data_at
        if self._paused or (self._events and self._waiter is None):
            silent_since = now  # the client is the slow one: not the upstream's fault
        if now - silent_since >= self._read_timeout_s:
            what = "response headers" if not self.headers_done else "the next part of the body"
            self._fail(
                UpstreamError(
                    "timeout", f"upstream sent nothing for {self._read_timeout_s:g} s ({what})"
                )
            )
        else:
            self._timer = self._loop.call_at(silent_since + self._read_timeout_s, self._check)


class UpstreamPool:
    """At most `max_connections` keep-alive connections to one host:port."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        use_tls: bool = False,
        max_connections: int = 256,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 300.0,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        self.host = host
        self.port = port
        self.max_connections = max_connections
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._ssl = ssl_module.create_default_context() if use_tls else None
        self._idle: list[UpstreamConnection] = []
        self._waiters: collections.deque[asyncio.Future[UpstreamConnection | None]] = (
            collections.deque()
        )
        self.open_connections = 0

    def use_tls(self, context: ssl_module.SSLContext) -> None:
        """Reach the upstream over TLS with `context` (its CAs, a client certificate for mTLS,
        or no verification at all: the caller decides); before the first connection."""
        self._ssl = context

    @property
    def tls(self) -> ssl_module.SSLContext | None:
        """The TLS context the upstream is reached with (None: plain HTTP)."""
        return self._ssl

    async def acquire(self, fresh: bool = False) -> UpstreamConnection:
        """A connection: the newest idle one, or a new one. `fresh`: the retry after a reused
        connection turned out closed; the other idle ones are as old and likely closed too
        (llama-server closes every connection after a streamed reply), so they are dropped."""
        idle = self._idle
        while fresh and idle:
            idle.pop().abort()
            self.open_connections -= 1
        while idle:
            connection = idle.pop()
            if not connection.closed:
                connection.reused = True
                return connection
            self.open_connections -= 1
        if self.open_connections >= self.max_connections:
            reused = await self._wait_for_slot()
            if reused is not None:
                return reused
        else:
            self.open_connections += 1
        try:
            return await self._connect()
        except BaseException:
            self._free_slot()
            raise

    def release(self, connection: UpstreamConnection) -> None:
        """Give a connection back after its response ended (or was abandoned)."""
        if not connection.reusable:
            connection.abort()
            self._free_slot()
            return
        connection.reused = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return
        self._idle.append(connection)

    def close(self) -> None:
        for connection in self._idle:
            connection.abort()
        self.open_connections -= len(self._idle)
        self._idle.clear()

    async def _connect(self) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, connection = await loop.create_connection(
                    lambda: UpstreamConnection(loop, self.read_timeout_s),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                )
        except TimeoutError:
            raise UpstreamError(
                "timeout", f"no connection within {self.connect_timeout_s:g} s"
            ) from None
        except ssl_module.SSLCertVerificationError as error:
            raise UpstreamError(
                "untrusted",
                f"its TLS certificate cannot be verified ({error.verify_message}); give its CA "
                "with --upstream-ca-certs",
            ) from None
        except ssl_module.SSLError as error:
            raise UpstreamError("tls", f"TLS handshake failed ({error.reason})") from None
        except OSError as error:
            raise UpstreamError(
                "unreachable", f"cannot connect ({error.strerror or error})"
            ) from None
        return connection

    async def _wait_for_slot(self) -> UpstreamConnection | None:
        """Wait for a released connection (returned) or a freed slot (None: connect anew)."""
        waiter: asyncio.Future[UpstreamConnection | None] = (
            asyncio.get_running_loop().create_future()
        )
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                return await waiter
        except BaseException as error:
            if waiter.done() and not waiter.cancelled():  # handed over as we gave up
                handed = waiter.result()
                if handed is not None:
                    self.release(handed)
                else:
                    self._free_slot()
            else:
                waiter.cancel()  # release() skips it
            if isinstance(error, TimeoutError):
                raise UpstreamError(
                    "timeout",
                    f"all {self.max_connections} upstream connections stayed busy for "
                    f"{self.connect_timeout_s:g} s",
                ) from None
            raise

    def _free_slot(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to the waiter, which connects
                return
        self.open_connections -= 1
