"""The typed shape of one OpenAI chunk (or plain body), as the wire parser decodes it.

msgspec decodes each data event into these small structs in C, skipping every field they do
not name. They live apart from `middleware.wire` so that both hot-path implementations
(`middleware._hotpath`, compiled, and `middleware._hotpath_py`) can import them without an
import cycle. `gc=False`: a decoded chunk holds no reference back to itself, so the cyclic
garbage collector need not track the few objects made per event (it ran in 7% of a profile
of the per-event scan).
"""

from __future__ import annotations

from typing import Any

import msgspec


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
    timings: dict[str, Any] | None = None
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


decode_chunk = msgspec.json.Decoder(Chunk).decode
decode_head = msgspec.json.Decoder(Head).decode
decode_body = msgspec.json.Decoder(Body).decode
NOT_DECODED = msgspec.DecodeError


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
