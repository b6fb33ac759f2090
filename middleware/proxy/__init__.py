"""`ProxyApp`: a streaming reverse proxy as a pure ASGI app, for `slo proxy --upstream URL`.

    app = LatencyMiddleware(ProxyApp("http://127.0.0.1:8080"), spec="slo.yaml", store=...)

Every request goes to the upstream as it came (method, path, query, headers less the
hop-by-hop ones, body); the answer comes back piece by piece as it arrives, with the
upstream's headers (some engines report their own timings there, e.g. TGI's x-queue-time).
A client that walks away closes the upstream connection, so the engine stops generating.
An upstream that is down, refuses or is silent too long gets an OpenAI-style 502 or 504, and
`scope["state"]["outcome"]` tells the middleware how to record it.

The request's timeline is marked "upstream_start" before the proxy reaches for the upstream
and "upstream_connected" once it holds a connection, as it writes the request (a body that
comes in parts: once it is all written), so reaching the upstream (waiting for a pooled
connection, connecting) is its own segment, apart from the proxy's own time before it and the
engine's time after it: the engine may start on a request before the proxy's task runs again
after the write. (The
upstream's response headers would be a later mark, but a non-streamed reply sends them only
after its last token: the whole generation would pass for network time.)
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

from middleware.proxy.client import UpstreamConnection, UpstreamError, UpstreamPool
from middleware.request.context import current_timeline
from middleware.request.state import request_state
from middleware.types import Message, Receive, Scope, Send
from middleware.wire.direct_body import direct_body

# RFC 9110 7.6.1: meaningful for one connection only, never forwarded. Content-length is
# recomputed (the body may have been rewritten on the way in), host names the upstream.
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
_NOT_FORWARDED = _HOP_BY_HOP | {b"host", b"content-length", b"expect"}


@dataclass(frozen=True)
class _Failure:
    """How the client is told of one kind of upstream failure (`UpstreamError.kind`): never
    the upstream's address or the socket's words, but what happened and the fix."""

    status: int
    type: str  # the OpenAI error type
    code: str
    said: str
    fix: str


_FAILURES = {
    "unreachable": _Failure(
        502,
        "server_error",
        "upstream_unreachable",
        "cannot be reached",
        "check that the engine is running and listening there, or fix --upstream",
    ),
    "timeout": _Failure(
        504,
        "timeout",
        "upstream_timeout",
        "did not answer in time",
        "raise --read-timeout if the engine is just slow, or check that it is healthy",
    ),
    "untrusted": _Failure(
        502,
        "server_error",
        "upstream_error",
        "has a TLS certificate that cannot be verified",
        "give its CA with --upstream-ca-certs",
    ),
    "tls": _Failure(
        502,
        "server_error",
        "upstream_error",
        "failed the TLS handshake",
        "check --upstream-certfile/--upstream-keyfile and the upstream's TLS settings",
    ),
    "broken": _Failure(
        502,
        "server_error",
        "upstream_error",
        "sent a broken response",
        "check that the engine is healthy",
    ),
}

logger = logging.getLogger("slo.proxy")


class ProxyApp:
    """Forwards every HTTP request to `upstream_url`; answers lifespan (closing its pool)."""

    def __init__(
        self,
        upstream_url: str,
        *,
        max_connections: int = 256,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 300.0,
    ) -> None:
        parts = urlsplit(upstream_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"upstream URL {upstream_url!r} must look like http://HOST:PORT "
                "(or https://...), e.g. http://127.0.0.1:8080"
            )
        for name, value in (("connect", connect_timeout_s), ("read", read_timeout_s)):
            if value <= 0:
                raise ValueError(
                    f"{name} timeout must be a positive number of seconds, got {value}"
                )
        self.upstream_url = upstream_url.rstrip("/")
        self._prefix = parts.path.rstrip("/").encode()
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self._host_header = parts.netloc.rsplit("@", 1)[-1].encode()
        self.pool = UpstreamPool(
            parts.hostname,
            port,
            use_tls=parts.scheme == "https",
            max_connections=max_connections,
            connect_timeout_s=connect_timeout_s,
            read_timeout_s=read_timeout_s,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._forward(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        # websockets are not proxied: returning without accepting closes them (403)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.pool.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body = message.get("body", b"")
        streamed_body = message.get("more_body", False)
        head = self._request_head(scope, None if streamed_body else len(body))
        timeline = current_timeline()
        if timeline is not None:
            timeline.mark("upstream_start")
        exchange = _Exchange(receive, streamed_body)
        if not streamed_body:  # the whole request is in: watch for the client leaving
            exchange.watch_client()
        try:
            connection = await self._connect(exchange, head, body)
            await self._relay(exchange, connection, scope, send)
        except UpstreamError as error:
            if exchange.gone.happened:
                return  # the client left: the middleware records it as cancelled
            await self._fail(scope, send, error, exchange.started, exchange.connection)
        finally:
            # Whatever ended the exchange (a retry that raised included): nothing outlives it.
            exchange.end(self.pool)

    async def _connect(self, exchange: _Exchange, head: bytes, body: bytes) -> UpstreamConnection:
        """A connection with the request written and the response's head read; it is held in
        `exchange.connection` from the moment it is taken, so `_Exchange.end` gives it back."""
        streamed_body, gone = exchange.streamed_body, exchange.gone
        timeline = current_timeline()
        first_try = True
        while True:
            connection = exchange.connection = await self._send_request(
                head, body, streamed_body, exchange.receive, gone, fresh=not first_try
            )
            if timeline is not None and streamed_body:
                timeline.mark("upstream_connected")
            if exchange.watch is None:
                exchange.watch_client()
            try:
                await connection.response_headers()
                return connection
            except UpstreamError as error:
                # A reused keep-alive connection that the upstream closed just as it was
                # taken: retried once on a new one (the upstream saw no request), the other
                # idle ones dropped (as old, likely closed as well).
                if not first_try or not error.sent_nothing or streamed_body or gone.happened:
                    raise
                self.pool.release(connection)
                exchange.connection = None
                first_try = False

    @staticmethod
    async def _relay(
        exchange: _Exchange, connection: UpstreamConnection, scope: Scope, send: Send
    ) -> None:
        """The upstream's response to the client, piece by piece as it arrives: written
        straight from the upstream connection's callback where the server offers it
        (`middleware.wire.direct_body`), else each piece sent by this task."""
        await send(
            {
                "type": "http.response.start",
                "status": connection.status,
                "headers": [
                    (name, value) for name, value in connection.headers if name not in _HOP_BY_HOP
                ],
            }
        )
        exchange.started = True
        if scope["method"] == "HEAD":  # no body follows, whatever content-length says;
            connection.abort()  # the parser would wait for one: not reused
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        offer = direct_body(scope, send)
        if offer is not None:
            connection.sink = offer.offer
        read = connection.read
        while (piece := await read()) is not None:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        if exchange.watch is not None:
            exchange.watch.cancel()  # before the last send: a completed response is no disconnect
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _send_request(
        self,
        head: bytes,
        body: bytes,
        streamed_body: bool,
        receive: Receive,
        gone: _ClientGone,
        fresh: bool = False,
    ) -> UpstreamConnection:
        """A connection (`fresh`: a new one) with the request written (a body that came in
        parts streams through, chunked)."""
        pool = self.pool
        connection = await pool.acquire(fresh)
        gone.connection = connection
        if gone.happened:
            pool.release(connection)
            raise UpstreamError("broken", "the client left before the request was sent")
        if not streamed_body:
            # Marked before the write: the upstream may start on the request (prefill) before
            # this task runs again, and what it does then is the engine's time, not reaching it.
            timeline = current_timeline()
            if timeline is not None:
                timeline.mark("upstream_connected")
            connection.send_request(head + body)
            return connection
        connection.send_request(head + _chunk(body))
        try:
            while True:
                message: Message = await receive()
                if message["type"] == "http.disconnect":
                    gone.leave()
                    raise UpstreamError("broken", "the client left while sending its body")
                connection.write(_chunk(message.get("body", b"")))
                if not message.get("more_body", False):
                    connection.write(b"0\r\n\r\n")
                    return connection
        except BaseException:
            pool.release(connection)
            raise

    def _request_head(self, scope: Scope, content_length: int | None) -> bytes:
        path = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string", b"")
        lines = [
            b"%s %s%s%s HTTP/1.1"
            % (scope["method"].encode(), self._prefix, path, b"?" + query if query else b""),
            b"host: " + self._host_header,
        ]
        forwarded_for = scope.get("client")
        for name, value in scope.get("headers", ()):
            name = name.lower()
            if name in _NOT_FORWARDED:
                continue
            if name == b"x-forwarded-for" and forwarded_for:
                value = b"%s, %s" % (value, forwarded_for[0].encode())
                forwarded_for = None
            lines.append(name + b": " + value)
        if forwarded_for:
            lines.append(b"x-forwarded-for: " + forwarded_for[0].encode())
        if content_length is None:
            lines.append(b"transfer-encoding: chunked")
        else:
            lines.append(b"content-length: %d" % content_length)
        lines.append(b"\r\n")
        return b"\r\n".join(lines)

    async def _fail(
        self,
        scope: Scope,
        send: Send,
        error: UpstreamError,
        started: bool,
        connection: UpstreamConnection | None,
    ) -> None:
        failure = _FAILURES.get(error.kind, _FAILURES["broken"])
        state = request_state(scope)
        state["outcome"] = "timeout" if failure.status == 504 else "server_error"
        # The client learns what kind of failure and what to do; the upstream's address and
        # the socket's or TLS library's words stay in the proxy's log (they map the network).
        logger.warning("slo proxy: upstream %s: %s", self.upstream_url, error.message)
        payload = {
            "error": {
                "message": f"slo proxy: the upstream {failure.said}; {failure.fix}",
                "type": failure.type,
                "param": None,
                "code": failure.code,
            }
        }
        if not started:
            await send(
                {
                    "type": "http.response.start",
                    "status": failure.status,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": json.dumps(payload).encode()})
            return
        is_stream = connection is not None and any(
            name == b"content-type" and value.startswith(b"text/event-stream")
            for name, value in connection.headers
        )
        if not is_stream:
            raise error  # a plain body cut short: the client must see a broken response
        # Mid-stream: an SSE error event, as OpenAI sends one (its client raises APIError).
        event = b"data: " + json.dumps(payload).encode() + b"\n\n"
        await send({"type": "http.response.body", "body": event, "more_body": False})


class _Exchange:
    """One request's state on its way through the proxy (never on the shared `ProxyApp`): the
    upstream connection it holds, the task watching for the client leaving, and whether the
    response to the client has started."""

    __slots__ = ("connection", "gone", "receive", "started", "streamed_body", "watch")

    def __init__(self, receive: Receive, streamed_body: bool) -> None:
        self.receive = receive
        self.streamed_body = streamed_body  # the body comes in parts, streamed through
        self.gone = _ClientGone()
        self.watch: asyncio.Task[None] | None = None
        self.connection: UpstreamConnection | None = None
        self.started = False

    def watch_client(self) -> None:
        self.watch = asyncio.ensure_future(self.gone.watch(self.receive))

    def end(self, pool: UpstreamPool) -> None:
        """Stops watching the client and gives the connection back (the pool decides whether
        it can be reused)."""
        if self.watch is not None:
            self.watch.cancel()
        if self.connection is not None:
            pool.release(self.connection)


class _ClientGone:
    """Watches for the client leaving; then closes the upstream connection."""

    __slots__ = ("connection", "happened")

    def __init__(self) -> None:
        self.happened = False
        self.connection: UpstreamConnection | None = None

    async def watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.leave()

    def leave(self) -> None:
        self.happened = True
        if self.connection is not None:
            self.connection.abort()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""
