"""One parser of the OpenAI wire format: chat and completions, SSE streams and plain JSON.

Used by the middleware (on the bytes the app sends) and by `slo bench` (on the bytes it reads).

- A **token event** is a chunk that carries non-empty text: `delta.content`, `text`,
  `delta.reasoning_content` / `delta.reasoning`, or tool-call `arguments`. Role-only, empty,
  finish-only and usage-only chunks, comments and `[DONE]` are not token events.
- `usage` (a plain body, or the last chunk of a stream with `stream_options.include_usage`)
  gives exact counts; vLLM's `continuous_usage_stats` puts a cumulative usage in every chunk.
- An engine's own report beside the OpenAI fields (a body key of its adapter,
  `middleware.upstream.registry`) is decoded with the chunk and read by that adapter.
- Without usage the count is the number of token events, and says so (`tokens_source`).

Per chunk the cost is a bytes search and, for chunks that look like data, one msgspec decode
into a small typed struct that skips every field it does not name (C, no dicts built;
`middleware.wire.chunk`). The per-chunk path of a stream is compiled where built
(`middleware.hotpath`).
"""

from __future__ import annotations

from typing import Any

import msgspec

import middleware.hotpath as hotpath
import middleware.wire.chunk as wire_chunk
from middleware.upstream import UpstreamReport, apply_usage
from middleware.upstream.registry import read_response_body
from middleware.wire.chunk import NOT_DECODED, Chunk, chunk_has_text, decode_head

__all__ = ["WireReader", "chunk_has_text"]


_FINISH_KEY = b'"finish_reason"'


def _finishes(event: bytes) -> bool:
    """Whether an event's bytes may hold a finish reason that is not null (any doubt: True)."""
    at = event.find(_FINISH_KEY)
    while at >= 0:
        start = at + len(_FINISH_KEY)
        value = event[start : start + 16].lstrip(b" :")
        if not value.startswith(b"null"):
            return True
        at = event.find(_FINISH_KEY, at + len(_FINISH_KEY))
    return False


class WireReader:
    """What one response put on the wire: token events, usage, the engine's reports.

    Feed it the body bytes in the order they are sent; `feed` answers per piece whether it
    carried a token event. Events split across pieces are joined first.
    """

    __slots__ = (
        "_events",
        "_head_pending",
        "_held_finish",
        "_pending",
        "_reports",
        "_token_events",
        "_usual",
        "comments",
        "done",
        "error",
        "finish_reasons",
        "finished",
        "report",
        "response_id",
        "response_model",
        "strip_usage",
    )

    def __init__(self, strip_usage: bool = False, keep_comments: bool = False) -> None:
        self._pending = b""
        self.report = UpstreamReport()
        # Counted here, and by the compiled scan in `_usual` (`events`, `token_events`).
        self._token_events = 0
        self._events = 0
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
        # The compiled hot path's memory of the stream's last usual token event: its bytes
        # around its text, and how many such events came (`_hotpath._UsualEvent`).
        self._usual: Any = None
        # SSE comment lines (`: ...`), kept when asked (slo bench reads the server's timings).
        self.comments: list[bytes] | None = [] if keep_comments else None
        # The client did not ask for usage; the middleware asked for it on its behalf: the
        # usage-only chunk is taken out of the stream and `"usage":null` out of every chunk.
        self.strip_usage = strip_usage
        # When stripping: the finish chunk, held until the next event. An engine that moves its
        # own report into the usage chunk when asked for usage (llama-server's `timings`) gets
        # it put back on the finish chunk, where the client would have read it unasked.
        self._held_finish: bytes | None = None
        # The engines' reports of the last chunk that carried one (`reports_in`).
        self._reports: dict[str, Any] | None = None

    @property
    def events(self) -> int:
        """OpenAI-shaped data events seen (any chunk with choices, usage or an engine's report)."""
        usual = self._usual
        return self._events if usual is None else self._events + usual.count

    @property
    def token_events(self) -> int:
        """Data events that carried output text (token events)."""
        usual = self._usual
        return self._token_events if usual is None else self._token_events + usual.count

    def feed(self, data: bytes) -> tuple[int, bytes]:
        """(token events in this piece, the bytes to send on: `data` itself unless stripping)."""
        # Fast path, nearly every chunk of every server: one whole `data: {...}` event.
        if (
            not self._pending
            and data.startswith(b"data: {")
            and data.find(b"\n\n") == len(data) - 2
        ):
            if self.strip_usage:
                if self._held_finish is not None or b'"usage"' in data or _finishes(data):
                    return self._strip_piece(data)
                # Nothing to take out or hold: counted as a reader that rewrites nothing would.
                return self.token_events_in(data), data
            if self._head_pending:
                self._read_head(data[6:-2])
            try:
                chunk = wire_chunk.decode_chunk(data[6:-2])
            except NOT_DECODED:
                return 0, data
            return (1 if self._decoded_has_text(chunk) else 0), data
        return self._strip_piece(data) if self.strip_usage else (self._scan(data), data)

    def passes_as_is(self, data: bytes) -> bool:
        """Whether `feed` would send this piece on unchanged and read it as `token_events_in`
        does: one whole data event, and, when stripping, nothing in it to take out or hold."""
        return (
            not self._pending
            and data.startswith(b"data: {")
            and data.find(b"\n\n") == len(data) - 2
            and (
                not self.strip_usage
                or (self._held_finish is None and b'"usage"' not in data and not _finishes(data))
            )
        )

    def _joined(self, data: bytes) -> bytes:
        """The whole events a piece completes: the held start of one before it, `\\n` line
        ends; the start of an event that continues in the next piece is kept back."""
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
        return data

    def _scan(self, data: bytes) -> int:
        """Token events in a piece passed on as it came (events split across pieces joined)."""
        data = self._joined(data)
        carried = 0
        for event in data.split(b"\n\n"):
            if event and self._event(event)[0]:
                carried += 1
        return carried

    def _strip_piece(self, data: bytes) -> tuple[int, bytes]:
        """(token events, the bytes to send on) of a piece of a stream whose usage the client
        did not ask for: the usage chunk and `"usage":null` taken out, the finish chunk held."""
        data = self._joined(data)
        carried = 0
        kept: list[bytes] = []
        for event in data.split(b"\n\n"):
            if event:
                carried += self._strip_event(event, kept)
        return carried, b"".join(event + b"\n\n" for event in kept)

    def _strip_event(self, event: bytes, kept: list[bytes]) -> bool:
        """One event of a stream whose usage the client did not ask for, onto `kept`."""
        finishes = len(self.finish_reasons)
        self._reports = None
        has_text, usage_only = self._event(event)
        held = self._held_finish
        if usage_only:
            if held is not None:
                kept.append(self._with_reports(held, self._reports))
                self._held_finish = None
            return has_text
        if held is not None:
            kept.append(held)
            self._held_finish = None
        event = event.replace(b',"usage":null', b"").replace(b'"usage":null,', b"")
        if len(self.finish_reasons) > finishes and not has_text:
            self._held_finish = event
        else:
            kept.append(event)
        return has_text

    @staticmethod
    def _with_reports(finish: bytes, reports: dict[str, Any] | None) -> bytes:
        """The finish event with the engine's reports the usage chunk carried, as its last keys."""
        body = finish.rstrip()
        if not reports or not body.endswith(b"}"):
            return finish
        added = b"".join(
            b',"' + key.encode() + b'":' + msgspec.json.encode(value)
            for key, value in reports.items()
            if b'"' + key.encode() + b'":' not in body
        )
        return body[:-1] + added + b"}"

    def flush(self) -> bytes:
        """What is still held back when stripping (a held finish chunk, an unfinished last
        event), to send as is."""
        if not self.strip_usage:
            self._pending = b""
            return b""
        held, self._pending = self._pending, b""
        if self._held_finish is not None:
            held = self._held_finish + b"\n\n" + held
            self._held_finish = None
        return held

    # The per-chunk hot path, compiled where built (`middleware.hotpath`):
    # `token_events_in(data) -> int` is `feed` without the tuple, for a reader that does not
    # rewrite the stream (each SSE event in the piece counted); `_decoded_has_text(chunk)`
    # says whether a decoded chunk is a token event, and counts it.
    token_events_in = hotpath.token_events_in
    _decoded_has_text = hotpath.decoded_has_text

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
            chunk = wire_chunk.decode_chunk(payload)
        except NOT_DECODED:
            return False, False
        return self._chunk(chunk)

    def _read_head(self, payload: Any) -> None:
        """The answer's id and model, from the first data event that has a JSON object."""
        self._head_pending = False
        try:
            head = decode_head(payload)
        except NOT_DECODED:
            return
        self.response_id, self.response_model = head.id, head.model

    def _chunk(self, chunk: Chunk) -> tuple[bool, bool]:
        self._events += 1
        if chunk.error is not None and self.error is None:
            self.error = chunk.error
        if chunk.choices and any(choice.finish_reason for choice in chunk.choices):
            self.finished = True
            self.finish_reasons.extend(c.finish_reason for c in chunk.choices if c.finish_reason)
        if chunk.usage is not None:
            apply_usage(self.report, chunk.usage)
        if wire_chunk.carries_report(chunk):
            self._reports = wire_chunk.reports_in(chunk)
            read_response_body(self.report, self._reports)
        if chunk_has_text(chunk):
            self._token_events += 1
            return True, False
        return False, not chunk.choices and chunk.usage is not None

    def read_body(self, body: bytes | bytearray) -> bool:
        """A plain (not streamed) JSON body: counts from usage or the engine's report; whether it
        has text."""
        try:
            chunk = wire_chunk.decode_body(body)  # the head's fields too: one decode of the body
        except NOT_DECODED:
            self._read_head(body)  # its id and model may still be read
            return False
        self._head_pending = False
        self.response_id, self.response_model = chunk.id, chunk.model
        return self._chunk(chunk)[0]

    @property
    def output_tokens(self) -> int:
        """Exact where the engine said (usage, its own report), else the token events counted."""
        reported = self.report.output_tokens
        return self.token_events if reported is None else reported

    @property
    def tokens_source(self) -> str:
        return self.report.tokens_source or "chunks"
