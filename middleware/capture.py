"""Opt-in capture of request and response content into spans, redacted and bounded.

Off by default: no prompt or completion text goes into records, spans, logs or metric labels.
Turned on (`MiddlewareConfig.of(capture=ContentCapture())`, with tracing on), the request's
SERVER span carries the GenAI conventions' opt-in attributes `gen_ai.input.messages` and
`gen_ai.output.messages` (JSON strings in the conventions' message schema: a role and parts
per message, `middleware.otel.messages`), every text after every redaction pattern replaced
its matches, and at most `max_chars` of text in each. Records never carry text, captured or not.

`CaptureMiddleware` is the ASGI layer that collects the bodies (stacked inside
`LatencyMiddleware` by `capture=`, only when spans are exported); it leaves the request's
`CaptureBuffer` in `scope["state"]["capture"]` for the layer that writes the span.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from middleware.otel.messages import input_messages, output_messages
from middleware.request.state import request_state
from middleware.types import ASGIApp, Message, Receive, Scope, Send

DEFAULT_REDACTIONS: tuple[str, ...] = (
    r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}",  # e-mail addresses
    r"\b(?:sk|pk|rk|api|key|tok)[-_][A-Za-z0-9_-]{12,}\b",  # API keys and tokens
    r"\bBearer\s+[A-Za-z0-9._~+/-]+=*",  # bearer credentials
    r"\b(?:\d[ -]?){13,19}\b",  # card-like digit runs
    r"\+?\d{1,3}[ .-]?\(?\d{2,4}\)?[ .-]?\d{3,4}[ .-]?\d{3,4}\b",  # phone numbers
)


@dataclass
class ContentCapture:
    max_chars: int = 4096
    patterns: Iterable[str] = DEFAULT_REDACTIONS
    replacement: str = "[REDACTED]"
    _compiled: list[re.Pattern[str]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._compiled = [re.compile(pattern) for pattern in self.patterns]

    def redact(self, text: str) -> str:
        for pattern in self._compiled:
            text = pattern.sub(self.replacement, text)
        return text

    def text(self, chunks: list[bytes]) -> str:
        raw = b"".join(chunks)[: self.max_chars * 4].decode("utf-8", errors="replace")
        return self.redact(raw[: self.max_chars])

    def span_attributes(self, buffer: CaptureBuffer) -> dict[str, str]:
        """`gen_ai.input.messages` and `gen_ai.output.messages` of one captured request."""
        return {
            "gen_ai.input.messages": input_messages(buffer.request, self),
            "gen_ai.output.messages": output_messages(buffer.response, self),
        }


class CaptureBuffer:
    """One request's bodies, bounded while they are collected."""

    __slots__ = ("limit", "request", "request_size", "response", "response_size")

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.request: list[bytes] = []
        self.response: list[bytes] = []
        self.request_size = 0
        self.response_size = 0

    def add_request(self, body: bytes) -> None:
        if self.request_size < self.limit:
            self.request.append(body[: self.limit - self.request_size])
            self.request_size += len(body)

    def add_response(self, body: bytes) -> None:
        if self.response_size < self.limit:
            self.response.append(body[: self.limit - self.response_size])
            self.response_size += len(body)


class CaptureMiddleware:
    """Pure ASGI: collects each request's and response's body, bounded, into its state."""

    def __init__(self, app: ASGIApp, capture: ContentCapture, routes: Iterable[str]) -> None:
        self.app = app
        self.capture = capture
        self.routes = frozenset(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path", "") not in self.routes:
            await self.app(scope, receive, send)
            return
        buffer = CaptureBuffer(self.capture.max_chars * 4)
        request_state(scope)["capture"] = buffer

        async def receive_body() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                buffer.add_request(message.get("body", b""))
            return message

        async def send_body(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.body" and message.get("body"):
                buffer.add_response(message["body"])

        await self.app(scope, receive_body, send_body)
