"""`ask_for_usage` rewrites a streamed request's body to ask for usage, and nothing else: the
body the app reads is the client's JSON with `stream_options.include_usage` set, whatever the
JSON holds (non-ASCII text, big integers, nesting), and `content-length` follows it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from middleware.types import Message
from middleware.wire.io import ask_for_usage

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def rewrite(body: bytes, pieces: int = 1) -> tuple[bool, list[Message], dict[bytes, bytes]]:
    """Run `ask_for_usage` over `body` sent in `pieces` messages; (asked, replay, headers)."""
    size = max(1, -(-len(body) // pieces))
    chunks = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    messages = [
        {"type": "http.request", "body": chunk, "more_body": index < len(chunks) - 1}
        for index, chunk in enumerate(chunks)
    ]
    scope: dict[str, Any] = {"headers": [(b"content-length", str(len(body)).encode())]}

    async def receive() -> Message:
        return messages.pop(0)

    replay: list[Message] = []
    asked = asyncio.run(ask_for_usage(scope, receive, replay))
    return asked, replay, dict(scope["headers"])


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.text(), JSON_VALUES, max_size=5),
    st.none() | st.dictionaries(st.text(), JSON_VALUES, max_size=3),
    st.integers(1, 4),
)
def test_a_streamed_request_is_the_same_json_with_usage_asked(
    fields: dict[str, Any], options: dict[str, Any] | None, pieces: int
) -> None:
    request = {key: value for key, value in fields.items() if not key.startswith("stream")}
    request["stream"] = True
    if options is not None:
        request["stream_options"] = options
    asked, replay, headers = rewrite(json.dumps(request).encode(), pieces)
    body = b"".join(message["body"] for message in replay)
    if options is not None and options.get("include_usage"):
        assert not asked and json.loads(body) == request  # asked already: left as sent
        return
    assert asked
    assert json.loads(body) == {
        **request,
        "stream_options": {**(options or {}), "include_usage": True},
    }
    assert headers[b"content-length"] == str(len(body)).encode()


def test_what_is_not_a_streamed_json_request_is_left_as_sent() -> None:
    for body in (
        b'{"stream": false}',
        b'{"model": "m"}',
        b"[1, 2]",
        b"{not json",
        b'{"stream": true, "temperature": NaN}',  # not JSON: the app answers it
        b'{"stream": true, "stream_options": 3}',
        b"",
    ):
        asked, replay, headers = rewrite(body)
        assert not asked, body
        assert b"".join(message["body"] for message in replay) == body
        assert headers[b"content-length"] == str(len(body)).encode()


def test_non_ascii_text_survives_the_rewrite() -> None:
    request = {"stream": True, "messages": [{"role": "user", "content": "héllo ☃ 你好"}]}
    asked, replay, _ = rewrite(json.dumps(request, ensure_ascii=False).encode())
    assert asked
    assert json.loads(replay[0]["body"])["messages"] == request["messages"]
