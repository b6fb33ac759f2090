"""One parser of the OpenAI wire format: chat and completions, SSE streams and plain JSON.

Used by the middleware (on the bytes the app sends) and by `slo bench` (on the bytes it reads).

- A **token event** is a chunk that carries non-empty text: `delta.content`, `text`,
  `delta.reasoning_content` / `delta.reasoning`, or tool-call `arguments`. Role-only, empty,
  finish-only and usage-only chunks, comments and `[DONE]` are not token events.
- `usage` (a plain body, or the last chunk of a stream with `stream_options.include_usage`)
  gives exact counts; vLLM's `continuous_usage_stats` puts a cumulative usage in every chunk.
  llama.cpp's `timings` rides in the last chunk or the body (`middleware.upstream.llamacpp`).
- Without usage the count is the number of token events, and says so (`tokens_source`).

Per chunk the cost is a bytes search and, for chunks that look like data, one msgspec decode
into a small typed struct that skips every field it does not name (C, no dicts built).
"""

from __future__ import annotations

from typing import Any

import msgspec

from middleware.upstream import UpstreamReport, apply_timings, apply_usage


class _Function(msgspec.Struct):
    arguments: str | None = None


class _ToolCall(msgspec.Struct):
    function: _Function | None = None


class _Delta(msgspec.Struct):
    content: Any = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    message: _Delta | None = None
    text: Any = None
    finish_reason: str | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    error: Any = None


class _Head(msgspec.Struct):
    """The answer's `id` and `model`: read from the first data event (and a plain body) only,
    so the per-chunk decode keeps skipping them."""

    id: Any = None
    model: Any = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode
_decode_head = msgspec.json.Decoder(_Head).decode
_NOT_DECODED = msgspec.DecodeError


def _has_text(value: Any) -> bool:
    if isinstance(value, str):
        return value != ""
    if isinstance(value, list):  # content parts: [{"type": "text", "text": "..."}]
        return any(isinstance(part, dict) and part.get("text") for part in value)
    return False


def _delta_has_text(delta: _Delta) -> bool:
    if _has_text(delta.content) or delta.reasoning_content or delta.reasoning:
        return True
    calls = delta.tool_calls or ()
    return any(c.function is not None and c.function.arguments for c in calls)


def chunk_has_text(chunk: _Chunk) -> bool:
    """Whether a decoded chunk (or plain body) carries output text: a token event."""
    for choice in chunk.choices or ():
        if _has_text(choice.text):
            return True
        delta = choice.delta or choice.message
        if delta is not None and _delta_has_text(delta):
            return True
    return False


class WireReader:
    """What one response put on the wire: token events, usage, timings.

    Feed it the body bytes in the order they are sent; `feed` answers per piece whether it
    carried a token event. Events split across pieces are joined first.
    """

    __slots__ = (
        "_head_pending",
        "_pending",
        "comments",
        "done",
        "error",
        "events",
        "finish_reasons",
        "finished",
        "report",
        "response_id",
        "response_model",
        "strip_usage",
        "token_events",
    )

    def __init__(self, strip_usage: bool = False, keep_comments: bool = False) -> None:
        self._pending = b""
        self.report = UpstreamReport()
        self.token_events = 0
        # OpenAI-shaped data events seen (any chunk with choices, usage or timings).
        self.events = 0
        # A chunk with a finish_reason was seen; the first `error` object an event carried.
        self.finished = False
        # `data: [DONE]` was read: the answer is whole, whatever happens to the connection.
        self.done = False
        self.error: Any = None
        # The answer's `id`, `model` (first data event or plain body) and each choice's
        # finish reason, in the order seen (from finish chunks: never the per-token path).
        self.response_id: Any = None
        self.response_model: Any = None
        self.finish_reasons: list[str] = []
        self._head_pending = True
        # SSE comment lines (`: ...`), kept when asked (slo bench reads the server's timings).
        self.comments: list[bytes] | None = [] if keep_comments else None
        # The client did not ask for usage; the middleware asked for it on its behalf: the
        # usage-only chunk is taken out of the stream and `"usage":null` out of every chunk.
        self.strip_usage = strip_usage

    def feed(self, data: bytes) -> tuple[int, bytes]:
        """(token events in this piece, the bytes to send on: `data` itself unless stripping)."""
        # Fast path, nearly every chunk of every server: one whole `data: {...}` event.
        if (
            not self._pending
            and not self.strip_usage
            and data.startswith(b"data: {")
            and data.find(b"\n\n") == len(data) - 2
        ):
            if self._head_pending:
                self._read_head(data[6:-2])
            try:
                chunk = _decode_chunk(data[6:-2])
            except _NOT_DECODED:
                return 0, data
            return (1 if self._decoded_has_text(chunk) else 0), data
        piece = data
        if self._pending:
            data = self._pending + data
            self._pending = b""
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        if not data.endswith(b"\n\n"):
            # An event continues in the next piece: keep its start for when the rest comes.
            cut = data.rfind(b"\n\n") + 2 if b"\n\n" in data else 0
            self._pending = data[cut:]
            data = data[:cut]
        carried = 0
        if not self.strip_usage:
            for event in data.split(b"\n\n"):
                if event and self._event(event)[0]:
                    carried += 1
            return carried, piece
        kept: list[bytes] = []
        for event in data.split(b"\n\n"):
            if not event:
                continue
            has_text, usage_only = self._event(event)
            carried += has_text
            if not usage_only:
                kept.append(event.replace(b',"usage":null', b"").replace(b'"usage":null,', b""))
        return carried, b"".join(event + b"\n\n" for event in kept)

    def flush(self) -> bytes:
        """What is still held back when stripping (an unfinished last event), to send as is."""
        held, self._pending = self._pending, b""
        return held if self.strip_usage else b""

    def token_events_in(self, data: bytes) -> int:
        """How many token events one piece of a stream carried (the middleware's hot path:
        `feed` without the tuple, for a reader that does not rewrite the stream). A piece can
        hold several SSE events (an upstream that writes them together, TCP merging them):
        each is counted."""
        if self._pending or not data.startswith(b"data: {") or data.find(b"\n\n") != len(data) - 2:
            return self.feed(data)[0]
        if self._head_pending:  # the first event only: one attribute read per chunk after it
            self._read_head(memoryview(data)[6:-2])
        try:
            chunk = _decode_chunk(memoryview(data)[6:-2])
        except _NOT_DECODED:
            return 0
        return 1 if self._decoded_has_text(chunk) else 0

    def _decoded_has_text(self, chunk: _Chunk) -> bool:
        """Whether a decoded chunk is a token event, counted. The usual delta (one choice with
        text; no usage, timings, error or finish) is decided in a few attribute reads."""
        choices = chunk.choices
        if (
            choices is not None
            and len(choices) == 1
            and chunk.usage is None
            and chunk.timings is None
            and chunk.error is None
        ):
            choice = choices[0]
            delta = choice.delta
            text = choice.text if delta is None else delta.content
            if choice.finish_reason is None and text.__class__ is str and text:
                self.events += 1
                self.token_events += 1
                return True
        return self._chunk(chunk)[0]

    def _event(self, event: bytes) -> tuple[bool, bool]:
        """(a token event, a usage-only chunk) for one SSE event's bytes."""
        if self.comments is not None and event.startswith(b":"):
            self.comments.extend(line for line in event.split(b"\n") if line.startswith(b":"))
        start = event.find(b"data:")
        if start < 0:
            return False, False  # a comment or a field we do not read
        payload = event[start + 5 :]
        if b"\ndata:" in payload:  # several data lines make one payload
            lines = event.replace(b"\r\n", b"\n").split(b"\n")
            payload = b"\n".join(
                line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")
            )
        payload = payload.strip()
        if not payload.startswith(b"{"):
            if payload == b"[DONE]":
                self.done = True
            return False, False  # [DONE] or not JSON
        if self._head_pending:
            self._read_head(payload)
        try:
            chunk = _decode_chunk(payload)
        except _NOT_DECODED:
            return False, False
        return self._chunk(chunk)

    def _read_head(self, payload: Any) -> None:
        """The answer's id and model, from the first data event that has a JSON object."""
        self._head_pending = False
        try:
            head = _decode_head(payload)
        except _NOT_DECODED:
            return
        self.response_id, self.response_model = head.id, head.model

    def _chunk(self, chunk: _Chunk) -> tuple[bool, bool]:
        self.events += 1
        if chunk.error is not None and self.error is None:
            self.error = chunk.error
        if chunk.choices and any(choice.finish_reason for choice in chunk.choices):
            self.finished = True
            self.finish_reasons.extend(c.finish_reason for c in chunk.choices if c.finish_reason)
        if chunk.usage is not None:
            apply_usage(self.report, chunk.usage)
        if chunk.timings is not None:
            apply_timings(self.report, chunk.timings)
        if chunk_has_text(chunk):
            self.token_events += 1
            return True, False
        return False, not chunk.choices and chunk.usage is not None

    def read_body(self, body: bytes) -> bool:
        """A plain (not streamed) JSON body: counts from usage/timings; whether it has text."""
        self._read_head(body)
        try:
            chunk = _decode_chunk(body)
        except _NOT_DECODED:
            return False
        return self._chunk(chunk)[0]

    @property
    def output_tokens(self) -> int:
        """Exact where the engine said (usage, timings), else the token events counted."""
        reported = self.report.output_tokens
        return self.token_events if reported is None else reported

    @property
    def tokens_source(self) -> str:
        return self.report.tokens_source or "chunks"
