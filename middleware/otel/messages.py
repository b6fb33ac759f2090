"""Captured bodies as the conventions' `gen_ai.input.messages` / `gen_ai.output.messages`.

The conventions' JSON schemas (docs/gen-ai/gen-ai-input-messages.json and -output-messages.json
at the commit in `middleware.otel.conventions`): a list of messages, each a `role` and `parts`
(`{"type": "text", "content": ...}`, `tool_call`, `tool_call_response`, or a generic part named
by its `type`); finish reasons go in `gen_ai.response.finish_reasons`, not in the messages (the
schema deprecates them there). On a span the list is a JSON
string (span attributes hold no nested values). Every text is redacted, and all the text of one
attribute together is cut to `max_chars`. A body cut short by the capture bound (or not JSON)
becomes one text part holding what was captured, redacted and cut the same way.
"""

from __future__ import annotations

import json
from typing import Any, Protocol


class Redactor(Protocol):
    max_chars: int

    def redact(self, text: str) -> str: ...


class _Budget:
    """Text allowance shared by every part of one attribute."""

    def __init__(self, capture: Redactor) -> None:
        self.capture = capture
        self.left = capture.max_chars

    def text(self, value: Any) -> str:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        text = self.capture.redact(text[: self.left])
        self.left = max(0, self.left - len(text))
        return text


def _document(chunks: list[bytes]) -> Any:
    try:
        return json.loads(b"".join(chunks))
    except ValueError:
        return None


def _raw(chunks: list[bytes], role: str, budget: _Budget) -> str:
    raw = b"".join(chunks).decode("utf-8", errors="replace")
    return _dump([{"role": role, "parts": [{"type": "text", "content": budget.text(raw)}]}])


def _dump(messages: list[dict[str, Any]]) -> str:
    return json.dumps(messages, ensure_ascii=False, separators=(",", ":"))


def _content_parts(content: Any, budget: _Budget) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "content": budget.text(content)}] if content else []
    parts: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "content": budget.text(part["text"])})
        else:  # images, audio, files: named, never copied
            parts.append({"type": str(part.get("type", "unknown"))})
    return parts


def _message(message: dict[str, Any], budget: _Budget) -> dict[str, Any]:
    role = str(message.get("role", "user"))
    parts = _content_parts(message.get("content"), budget)
    if role == "tool":
        parts = [
            {
                "type": "tool_call_response",
                "id": message.get("tool_call_id"),
                "response": budget.text(message.get("content", "")),
            }
        ]
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            parts.append(
                {
                    "type": "tool_call",
                    "id": call.get("id"),
                    "name": str(function.get("name") or ""),
                    "arguments": budget.text(function.get("arguments", "")),
                }
            )
    return {"role": role, "parts": parts}


def input_messages(chunks: list[bytes], capture: Redactor) -> str:
    """A chat request's `messages`, or a completions request's `prompt` as one user message."""
    budget = _Budget(capture)
    request = _document(chunks)
    if not isinstance(request, dict):
        return _raw(chunks, "user", budget)
    messages = request.get("messages")
    if isinstance(messages, list):
        return _dump([_message(m, budget) for m in messages if isinstance(m, dict)])
    prompt = request.get("prompt")
    prompts = prompt if isinstance(prompt, list) else [prompt]
    return _dump(
        [
            {"role": "user", "parts": _content_parts(p, budget)}
            for p in prompts
            if isinstance(p, str)
        ]
    )


def _choices_of_stream(chunks: list[bytes]) -> list[dict[str, Any]] | None:
    """The choices a stream's `data:` events carried, joined per choice index."""
    joined: dict[int, dict[str, Any]] = {}
    text = b"".join(chunks).replace(b"\r\n", b"\n")
    for event in text.split(b"\n\n"):
        payload = b"".join(
            line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")
        )
        if not payload.startswith(b"{"):
            continue
        try:
            chunk = json.loads(payload)
        except ValueError:
            return None  # cut by the capture bound
        for choice in chunk.get("choices") or ():
            into = joined.setdefault(choice.get("index", 0), {"text": []})
            delta = choice.get("delta") or {}
            piece = delta.get("content") if isinstance(delta, dict) else None
            piece = piece if isinstance(piece, str) else choice.get("text")
            if isinstance(piece, str):
                into["text"].append(piece)
    if not joined:
        return None  # not a stream of chunks either
    return [{"message": {"content": "".join(c["text"])}} for _, c in sorted(joined.items())]


def output_messages(chunks: list[bytes], capture: Redactor) -> str:
    """The answer's choices (a plain JSON body or an SSE stream), one message each."""
    budget = _Budget(capture)
    answer = _document(chunks)
    choices = answer.get("choices") if isinstance(answer, dict) else _choices_of_stream(chunks)
    if not isinstance(choices, list):
        return _raw(chunks, "assistant", budget)
    messages = []
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        message = choice.get("message") or {"content": choice.get("text")}
        messages.append(_message({**message, "role": "assistant"}, budget))
    return _dump(messages)
