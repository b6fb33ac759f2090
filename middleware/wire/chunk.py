"""The typed shape of one OpenAI chunk (or plain body), as the wire parser decodes it.

msgspec decodes each data event into these small structs in C, skipping every field they do
not name. They live apart from `middleware.wire.reader` so that both hot-path implementations
(`middleware._hotpath`, compiled, and `middleware._hotpath_py`) can import them without an
import cycle. `gc=False`: a decoded chunk holds no reference back to itself, so the cyclic
garbage collector need not track the few objects made per event (it ran in 7% of a profile
of the per-event scan).

The engines' own reports beside the OpenAI fields (llama.cpp's `timings`: each adapter's
`body_keys`, `middleware.upstream.registry`) are fields of a subclass made from the registry,
made again when an adapter brings a new key; so read the decoders as `wire_chunk.decode_chunk`
and `wire_chunk.decode_body`, at the call, and a chunk's reports with `reports_in`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from middleware.upstream.registry import BODY_KEYS, BODY_KEYS_LISTENERS


class Function(msgspec.Struct, gc=False):
    arguments: str | None = None


class ToolCall(msgspec.Struct, gc=False):
    function: Function | None = None


class Delta(msgspec.Struct, gc=False):
    content: Any = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] | None = None


class Choice(msgspec.Struct, gc=False):
    delta: Delta | None = None
    message: Delta | None = None
    text: Any = None
    finish_reason: str | None = None


class Chunk(msgspec.Struct, gc=False):
    choices: list[Choice] | None = None
    usage: dict[str, Any] | None = None
    error: Any = None


class Head(msgspec.Struct, gc=False):
    """The answer's `id` and `model`: read from the first data event (and a plain body) only,
    so the per-chunk decode keeps skipping them."""

    id: Any = None
    model: Any = None


class Body(Chunk, gc=False):
    """A plain (not streamed) JSON answer: a chunk's fields and the head's, in one decode."""

    id: Any = None
    model: Any = None


decode_head = msgspec.json.Decoder(Head).decode
NOT_DECODED = msgspec.DecodeError
# Made by `_read_body_keys` from the registry: the decoders, and the attribute of each body key.
decode_chunk: Any = msgspec.json.Decoder(Chunk).decode
decode_body: Any = msgspec.json.Decoder(Body).decode
REPORT_FIELDS: tuple[tuple[str, str], ...] = ()  # (attribute, body key)


def _read_body_keys() -> None:
    """Decode every registered body key too (any JSON value; None where absent or null)."""
    global decode_chunk, decode_body, REPORT_FIELDS
    REPORT_FIELDS = tuple((f"report_{index}", key) for index, key in enumerate(BODY_KEYS))
    fields = [(name, Any, msgspec.field(default=None, name=key)) for name, key in REPORT_FIELDS]
    reporting_chunk = msgspec.defstruct("Chunk", fields, bases=(Chunk,), gc=False)
    reporting_body = msgspec.defstruct("Body", fields, bases=(Body,), gc=False)
    decode_chunk = msgspec.json.Decoder(reporting_chunk).decode
    decode_body = msgspec.json.Decoder(reporting_body).decode


def carries_report(chunk: Chunk) -> bool:
    """Whether a decoded chunk (or body) carries one of the engines' reports."""
    for name, _ in REPORT_FIELDS:  # noqa: SIM110 (a loop, no generator: asked once per chunk)
        if getattr(chunk, name) is not None:
            return True
    return False


def reports_in(chunk: Chunk) -> dict[str, Any]:
    """The engines' reports a decoded chunk (or body) carries, by body key."""
    found = {}
    for name, key in REPORT_FIELDS:
        value = getattr(chunk, name)
        if value is not None:
            found[key] = value
    return found


_read_body_keys()
BODY_KEYS_LISTENERS.append(_read_body_keys)


def _has_text(value: Any) -> bool:
    if isinstance(value, str):
        return value != ""
    if isinstance(value, list):  # content parts: [{"type": "text", "text": "..."}]
        return any(isinstance(part, dict) and part.get("text") for part in value)
    return False


def _delta_has_text(delta: Delta) -> bool:
    if _has_text(delta.content) or delta.reasoning_content or delta.reasoning:
        return True
    calls = delta.tool_calls or ()
    return any(c.function is not None and c.function.arguments for c in calls)


def chunk_has_text(chunk: Chunk) -> bool:
    """Whether a decoded chunk (or plain body) carries output text: a token event."""
    for choice in chunk.choices or ():
        if _has_text(choice.text):
            return True
        delta = choice.delta or choice.message
        if delta is not None and _delta_has_text(delta):
            return True
    return False
