"""`Exchange`: one measured request, in the starlette responder style.

The app is called with `exchange.receive` and `exchange.send`; they mark the request's
timeline as its body comes in and its answer goes out, read the answer's wire (token events,
usage, timings, the upstream's headers) and give the client its server timings. `settle`
takes the counts once the app is done. Made per request, never shared.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import middleware.hotpath as hotpath
from middleware.request.reporting import server_timing_value, timings_comment
from middleware.request.timeline import RequestTimeline
from middleware.types import Message, Receive, Send
from middleware.wire.io import (
    UPSTREAM_HEADERS,
    keep_body,
    read_upstream_headers,
    settle_body,
    settle_stream,
)
from middleware.wire.reader import WireReader

# Request bodies kept for their fields up to this size (a long prompt is a few MB of JSON).
MAX_REQUEST_BODY = 16 << 20


class Exchange:
    __slots__ = (
        "_chunk_sent",
        "_feed",
        "_hot",
        "_receive",
        "_request_body",
        "_send",
        "body",
        "complete",
        "delivered",
        "disconnected",
        "is_stream",
        "now_ns",
        "replay",
        "server",
        "server_timing",
        "started",
        "status",
        "strip_usage",
        "timeline",
        "wire",
    )

    def __init__(
        self,
        timeline: RequestTimeline,
        receive: Receive,
        send: Send,
        now_ns: Callable[[], int],
        *,
        replay: list[Message],
        strip_usage: bool = False,
        server_timing: bool = True,
        keep_request: bool = False,
        server: object = None,
    ) -> None:
        self.timeline = timeline
        self._receive = receive
        self._send = send
        self.now_ns = now_ns
        self.replay = replay  # the request's messages already read (usage asked for)
        self.strip_usage = strip_usage
        self.server_timing = server_timing
        self.wire = WireReader(strip_usage)
        self._feed = self.wire.feed
        self._chunk_sent = timeline.chunk_sent
        # An SSE stream whose pieces pass as they are (no usage to strip): `send` marks its
        # middle chunks without a coroutine of its own, from what it needs per chunk, in one
        # read (set when the response starts): the wire reader, the timeline, its chunk and
        # token marks, the server's send and the clock.
        self._hot: tuple[Any, ...] | None = None
        self.status = 500
        self.started = False
        self.complete = False
        self.disconnected = False
        self.is_stream = False
        # The stream's `data: [DONE]` was handed to the server: the client has the whole answer
        # even if it closes before the response's last (empty) message (the openai client does).
        self.delivered = False
        self.body: bytearray | None = None  # a plain JSON reply, kept for its usage
        # The request body, kept for the model and sampling fields the GenAI conventions
        # record (read once the request is reported: `middleware.otel.request`).
        self._request_body: bytearray | None = bytearray() if keep_request else None
        self.server = server  # the ASGI scope's (host, port) of the listening socket

    async def receive(self) -> Message:
        message = self.replay.pop(0) if self.replay else await self._receive()
        kind = message["type"]
        if kind == "http.request":
            kept = self._request_body
            if kept is not None:
                if len(kept) < MAX_REQUEST_BODY:
                    kept += message.get("body", b"")
                else:  # past the bound the fields are not read (cut JSON would not parse)
                    self._request_body = None
            if not message.get("more_body", False):
                self.timeline.body_received(self.now_ns())
        elif kind == "http.disconnect":
            self.disconnected = True
        return message

    # The app's `send`: an awaitable, as ASGI asks. A stream's middle chunk (the hot path, once
    # per token) is marked by the compiled hot path where built (`middleware.hotpath`), and
    # when it carried a token event the server's own `send` is handed back to be awaited:
    # nothing is left to do after it, so no coroutine of ours is made for it. Every other
    # message goes to `_send_message`.
    send = hotpath.exchange_send

    def _send_message(self, message: Message) -> Awaitable[None]:
        """`send` for every message the hot path does not take."""
        if message["type"] == "http.response.body":
            body = message.get("body")
            if body and self.is_stream and message.get("more_body", False):
                return self._stream_chunk(message, body)
            return self._last_or_plain(message, body)
        if message["type"] == "http.response.start":
            message = self._start(message)
        return self._send(message)

    def quiet_piece_sent(self) -> None:
        """A piece of the stream with no token event went to the server. If it held the
        stream's `data: [DONE]`, the client has the whole answer, even if it closes before the
        response's last (empty) message, as the openai client does: the request is delivered,
        and its last byte was sent now, unless a later message comes. Every path that hands a
        stream piece over calls this (the hot path's twins and the direct write included)."""
        if self.wire.done and not self.delivered:
            self.delivered = True
            self.timeline.last_byte_sent(self.now_ns())

    async def _sent_quiet_chunk(self, message: Message) -> None:
        """A middle chunk with no token event (already marked): it may have held the
        stream's `[DONE]`, after which the client has the whole answer."""
        await self._send(message)
        self.quiet_piece_sent()

    async def _stream_chunk(self, message: Message, body: bytes) -> None:
        """A chunk in the middle of a stream that the hot path did not take: usage is
        stripped from it, or the message is a mapping but not a dict (`feed` then counts what
        `token_events_in` would, and hands the piece back as it came)."""
        started = self.now_ns()
        carried, sent = self._feed(body)
        if sent is not body:
            message = {**message, "body": sent}
        self._chunk_sent(started, carried)
        await self._send(message)
        if not carried:
            self.quiet_piece_sent()

    async def _last_or_plain(self, message: Message, body: bytes | None) -> None:
        started = self.now_ns()
        more = message.get("more_body", False)
        timeline = self.timeline
        if self.is_stream:
            if body:
                carried, sent = self._feed(body)
                if sent is not body:
                    message = {**message, "body": sent}
                timeline.chunk_sent(started, carried)
            if not more:
                held = self.wire.flush()
                if held:
                    message = {**message, "body": message.get("body", b"") + held}
                settle_stream(timeline, self.wire)
                if self.server_timing and self.status < 400:
                    # With the stream's end: one write to the client, not two.
                    comment = timings_comment(timeline.breakdown())
                    message = {**message, "body": message.get("body", b"") + comment}
        elif body:
            # A plain reply's first piece carries its text (one token event).
            timeline.chunk_sent(started, 0 if timeline.body_chunk_ns else 1)
            keep_body(self, body)
        await self._send(message)
        if not more:
            timeline.last_byte_sent(self.now_ns())
            self.complete = True

    def _start(self, message: Message) -> Message:
        self.status = message["status"]
        self.started = True
        raw_headers = list(message.get("headers", ()))
        upstream_headers: dict[bytes, bytes] = {}
        for key, value in raw_headers:
            name = key.lower()
            if name == b"content-type":
                if value.startswith(b"text/event-stream"):
                    self.is_stream = True
                    if not self.strip_usage:
                        timeline = self.timeline
                        self._hot = (
                            self.wire,
                            timeline,
                            timeline.body_chunk_ns,
                            timeline.token_chunk_ns,
                            self._send,
                            self.now_ns,
                        )
                    self.timeline.stream_started()
                elif value.startswith(b"application/json"):
                    self.body = bytearray()
            elif name in UPSTREAM_HEADERS:
                upstream_headers[name] = value
        if upstream_headers:
            read_upstream_headers(self.timeline, self.wire, upstream_headers)
        if self.server_timing and not self.is_stream:
            timing = server_timing_value(self.timeline.breakdown()).encode()
            raw_headers.append((b"server-timing", timing))
            message = {**message, "headers": raw_headers}
        return message

    @property
    def request_body(self) -> bytearray | None:
        """The request body as received (None when not kept, or past MAX_REQUEST_BODY)."""
        kept = self._request_body
        return None if kept is None or len(kept) > MAX_REQUEST_BODY else kept

    def settle(self) -> None:
        """The app is done: take the counts its answer carried (a stream that did not end
        keeps the counts so far)."""
        if not self.is_stream:
            settle_body(self.timeline, self.wire, self.body)
        elif not self.complete:
            settle_stream(self.timeline, self.wire)
