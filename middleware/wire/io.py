"""The middleware's side of the wire: asking for usage on the client's behalf, keeping a plain
body for its usage, and settling a response's counts and phases once it is sent."""

from __future__ import annotations

from typing import Any

import msgspec

from middleware.request.timeline import RequestTimeline
from middleware.types import Message, Receive, Scope
from middleware.upstream import read_response_headers
from middleware.upstream.registry import RESPONSE_HEADERS
from middleware.wire.reader import WireReader

# The request body is parsed and, when usage is asked for, written again on every streamed
# request: msgspec does both in a fifth of the stdlib's time (2 vs 11 us for a chat request).
_decode_request = msgspec.json.Decoder().decode
_encode_request = msgspec.json.Encoder().encode
# A plain (not streamed) JSON body is kept for its usage up to this size.
MAX_READ_BODY = 4 << 20
# Response headers an upstream adapter reads, from the registry (`EngineAdapter.headers`).
UPSTREAM_HEADERS = RESPONSE_HEADERS


async def ask_for_usage(scope: Scope, receive: Receive, replay: list[Message]) -> bool:
    """Read the request body (into `replay`) and, for a streamed request that did not ask for
    usage, add `stream_options.include_usage`; True when it was added (strip it from the reply).

    The body is read before the app runs so `content-length` can be set to the new size.
    """
    body = bytearray()
    while True:
        message = await receive()
        replay.append(message)
        if message["type"] != "http.request":
            return False  # the client went away; the app hears it from `replay`
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    try:
        request: Any = _decode_request(body)
    except msgspec.DecodeError:
        return False  # the app answers a malformed body with its own 400
    if not isinstance(request, dict) or request.get("stream") is not True:
        return False
    options = request.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        return False
    if options is not None and not isinstance(options, dict):
        return False
    request["stream_options"] = {**(options or {}), "include_usage": True}
    new_body = _encode_request(request)
    replay[:] = [{"type": "http.request", "body": new_body, "more_body": False}]
    scope["headers"] = [
        (key, str(len(new_body)).encode()) if key.lower() == b"content-length" else (key, value)
        for key, value in scope.get("headers", ())
    ]
    return True


def keep_body(response: Any, body: bytes) -> None:
    """Keep a plain JSON body for its usage; past MAX_READ_BODY, give up on it."""
    kept = response.body
    if kept is not None:
        if len(kept) + len(body) > MAX_READ_BODY:
            response.body = None
        else:
            kept += body


def read_upstream_headers(
    timeline: RequestTimeline, wire: WireReader, headers: dict[bytes, bytes]
) -> None:
    """Phases and counts an engine put in its response headers (its adapter's
    `read_headers`): `headers` holds the UPSTREAM_HEADERS found, by lower-case name."""
    if read_response_headers(wire.report, headers):
        timeline.take_upstream(wire.report)


def _take_counts(timeline: RequestTimeline, wire: WireReader) -> None:
    report = timeline.take_upstream(wire.report)
    timeline.take_counts(report.input_tokens, report.cached_tokens)


def settle_stream(timeline: RequestTimeline, wire: WireReader) -> None:
    """The stream's last message: counts from usage/timings; a stream that is not in the
    OpenAI format has every chunk taken as one token event."""
    if wire.events == 0 and timeline.body_chunk_ns:
        timeline.count_every_chunk()
    _take_counts(timeline, wire)


def settle_body(timeline: RequestTimeline, wire: WireReader, body: bytearray | None) -> None:
    """A plain response is sent: its JSON body's usage, timings and whether it holds text."""
    if body:
        has_text = wire.read_body(body)
        if wire.events and not has_text:
            timeline.token_chunk_ns.clear()  # an OpenAI body without text: no token
        _take_counts(timeline, wire)
