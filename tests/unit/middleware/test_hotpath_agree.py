"""The compiled and the pure-Python hot paths agree event for event on any SSE stream: random
events (token deltas, role, reasoning, tool calls, finish, usage, timings, errors, comments,
keep-alives, `[DONE]`, broken JSON), written in several JSON spellings and split across pieces
anyhow, read by a WireReader on each path. A second property mutates single whole events (the
pieces the compiled byte scan decides without msgspec) byte by byte."""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from middleware import _hotpath_py, hotpath
from middleware.hotpath import compiled
from middleware.wire.reader import WireReader
from tests.conftest import require_or_skip

TEXT = st.text(max_size=12) | st.sampled_from(["", " the", "\n", 'a"b\\c', "é", "日本", "🙂"])


class PureReader(WireReader):
    __slots__ = ()
    token_events_in = _hotpath_py.token_events_in
    _decoded_has_text = _hotpath_py.decoded_has_text


def compiled_reader_class() -> type[WireReader]:
    built = hotpath.compiled()  # built, whichever one LLM_SLO_PURE_PYTHON makes the default
    if built is None:
        require_or_skip("middleware._hotpath is not built: `pip install -e .` with a C compiler")

    class CompiledReader(WireReader):
        __slots__ = ()
        token_events_in = built.token_events_in
        _decoded_has_text = built.decoded_has_text

    return CompiledReader


def choice(delta: dict[str, Any] | None, finish: str | None, text: Any = None) -> dict[str, Any]:
    made: dict[str, Any] = {"index": 0}
    if delta is not None:
        made["delta"] = delta
    if text is not None:
        made["text"] = text
    made["logprobs"] = None
    made["finish_reason"] = finish
    return made


@st.composite
def chunk(draw: st.DrawFn) -> dict[str, Any]:
    """One chunk as OpenAI-compatible engines stream them: id, `"object":
    "chat.completion.chunk"`, created, model and choices of index, delta (or a completion's
    text), logprobs and finish_reason; the delta a role, content, reasoning_content or
    tool_calls (an empty list too), or a whole message in the chunk. Then the odd extra field:
    usage (null, or counts), llama.cpp's timings, an error, a float."""
    kind = draw(
        st.sampled_from(
            ["delta", "delta", "delta", "role", "text", "reason", "tool", "no_tools", "message"]
        )
    )
    text = draw(TEXT)
    finish = draw(st.sampled_from([None, None, None, "stop", "length", ""]))
    delta: dict[str, Any] | None = {"content": text}
    if kind == "role":
        delta = {"role": "assistant", "content": draw(st.sampled_from([None, ""]))}
    elif kind == "reason":
        delta = {"reasoning_content": text}
    elif kind == "tool":
        delta = {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}
    elif kind == "no_tools":  # an empty list of calls: no text
        delta = {"content": draw(st.sampled_from([None, ""])), "tool_calls": []}
    made: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk"}
    made["created"] = draw(st.integers(0, 2**70))
    made["model"] = "m"
    made["choices"] = [
        choice(
            None if kind in ("text", "message") else delta, finish, text if kind == "text" else None
        )
    ]
    if kind == "message":  # a whole message in a chunk (some servers' last event)
        made["choices"][0]["message"] = {"content": draw(st.sampled_from([None, "", text]))}
    if draw(st.booleans()):
        made["choices"].append(choice({"content": text}, None))
    extra = draw(st.sampled_from(["", "", "usage_null", "usage", "timings", "error", "float"]))
    if extra == "usage_null":
        made["usage"] = None
    elif extra == "usage":
        made["usage"] = {"prompt_tokens": 3, "completion_tokens": draw(st.integers(0, 9))}
    elif extra == "timings":
        made["timings"] = {"prompt_n": 3, "prompt_ms": 1.5, "predicted_n": 4, "predicted_ms": 2.0}
    elif extra == "error":
        made["error"] = {"message": "overloaded"}
    elif extra == "float":
        made["system_fingerprint"] = draw(st.floats(allow_nan=False, allow_infinity=False))
    if draw(st.booleans()):
        made["choices"] = made["choices"][:1]
    return made


def spell(data: Any, style: int) -> bytes:
    if style == 0:
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    if style == 1:
        return json.dumps(data).encode()  # spaces and \\u escapes
    return json.dumps(data, indent=1, sort_keys=True).encode().replace(b"\n", b" ")


@st.composite
def event(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["chunk"] * 8 + ["usage", "comment", "done", "broken", "fields"]))
    style = draw(st.integers(0, 2))
    if kind == "chunk":
        return b"data: " + spell(draw(chunk()), style) + b"\n\n"
    if kind == "usage":
        usage = {"prompt_tokens": 5, "completion_tokens": draw(st.integers(0, 50))}
        return b"data: " + spell({"id": "x", "choices": [], "usage": usage}, style) + b"\n\n"
    if kind == "comment":
        return draw(st.sampled_from([b": keep-alive\n\n", b":\n\n", b": ping\r\n\r\n"]))
    if kind == "done":
        return b"data: [DONE]\n\n"
    if kind == "broken":
        whole = spell(draw(chunk()), style)
        return b"data: " + whole[: draw(st.integers(0, len(whole)))] + b"\n\n"
    payload = spell(draw(chunk()), style)  # other SSE fields, several data lines, CRLF
    half = len(payload) // 2
    return draw(
        st.sampled_from(
            [
                b"event: message\ndata: " + payload + b"\n\n",
                b"data: " + payload[:half] + b"\ndata: " + payload[half:] + b"\n\n",
                b"data:" + payload + b"\r\n\r\n",
            ]
        )
    )


def pieces(draw: st.DrawFn, events: list[bytes]) -> list[bytes]:
    """Per event (most servers), several events together, or cut anywhere."""
    mode = draw(st.sampled_from(["each", "each", "grouped", "cut"]))
    if mode == "each":
        return events
    stream = b"".join(events)
    if mode == "grouped":
        size = draw(st.integers(1, 4))
        return [b"".join(events[at : at + size]) for at in range(0, len(events), size)]
    cuts = sorted(draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    bounds = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds) if stream[a:b]]


def state(reader: WireReader) -> tuple[Any, ...]:
    report = reader.report
    return (
        reader.token_events,
        reader.events,
        reader.finished,
        reader.finish_reasons,
        reader.done,
        reader.error,
        reader.response_id,
        reader.response_model,
        reader.output_tokens,
        reader.tokens_source,
        (report.output_tokens, report.input_tokens, report.prefill_s, report.decode_s),
    )


def read_both(stream: list[bytes]) -> None:
    compiled, pure = compiled_reader_class()(), PureReader()
    for piece in stream:
        assert compiled.token_events_in(piece) == pure.token_events_in(piece), piece
        assert state(compiled) == state(pure), piece
    assert compiled._pending == pure._pending


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_both_paths_agree_event_for_event(data: st.DataObject) -> None:
    events = data.draw(st.lists(event(), min_size=1, max_size=12))
    read_both(pieces(data.draw, events))


MUTATIONS = st.sampled_from(["flip", "insert", "delete", "space"])


@settings(max_examples=400, deadline=None)
@given(
    chunk(),
    st.integers(0, 2),
    st.lists(st.tuples(MUTATIONS, st.integers(0), st.integers(0, 255)), max_size=3),
)
def test_both_paths_agree_on_mutated_single_events(
    made: dict[str, Any], style: int, mutations: list[tuple[str, int, int]]
) -> None:
    """Whole `data: {...}` pieces after the first (the byte scan's domain), a few bytes changed:
    the scan must say "the usual token" only where msgspec says so too."""
    payload = bytearray(spell(made, style))
    for kind, where, byte in mutations:
        at = where % (len(payload) + 1)
        if kind == "flip" and at < len(payload):
            payload[at] = byte
        elif kind == "insert":
            payload[at:at] = bytes([byte])
        elif kind == "delete" and at < len(payload):
            del payload[at]
        elif kind == "space":
            payload[at:at] = b" \t"[byte % 2 :][:1]
    first = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'  # reads the head
    read_both([first, b"data: " + bytes(payload) + b"\n\n"])


# Raw bytes for a text string's place in a usual event: JSON escapes, quotes, backslashes,
# control bytes, bytes that are not UTF-8, an escaped quote or backslash at the very end.
STRING_BODY = st.binary(max_size=10) | st.sampled_from(
    [b"", b" the", b'a\\"b', b'\\"', b"\\", b"\\\\", b"\\u00e9", b"\\ud83d\\ude00", b"\n",
     b"\xc3\xa9", b"\xff", b'"', b'","x":"', b"\\n", b"}]}"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(
        [
            b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"%s"},'
            b'"finish_reason":null}]}\n\n',
            b'data: {"choices":[{"text":"%s","index":0,"logprobs":null,"finish_reason":null}]}\n\n',
            b'data: {"choices": [{"delta": {"content": "%s", "role": null}}], "usage": null}\n\n',
        ]
    ),
    st.lists(STRING_BODY, min_size=1, max_size=8),
    st.lists(st.sampled_from([b"data: [DONE]\n\n", b": ping\n\n", b'data: {"choices":[]}\n\n'])),
)
def test_both_paths_agree_on_events_of_one_shape(
    shape: bytes, texts: list[bytes], others: list[bytes]
) -> None:
    """Most events of a stream differ from the one before only in their text: the compiled
    path compares such an event with the stream's last usual one around the text (no scan of
    the rest), and must still give msgspec's verdict for any bytes in the text's place."""
    first = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'  # reads the head
    events = [first, shape % b"hi"] + [shape % text for text in texts] + others
    events.append(shape % texts[0])
    read_both(events)


def test_the_usual_delta_is_decided_by_the_byte_scan() -> None:
    """The compiled path counts a usual delta without decoding it; every twist that makes it
    not the usual one (finish, usage, two choices, a duplicate key, an escaped key, a surrogate
    escape, a huge number, trailing bytes) gives the answer msgspec gives."""
    head = b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
    usual = b'{"id":"c","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}'
    twists = [
        usual,
        usual.replace(b"null", b'"stop"'),
        usual.replace(b'"id":"c"', b'"usage":{"completion_tokens":3}'),
        usual.replace(b'"id":"c"', b'"usage":null,"error":null,"timings":null'),
        usual.replace(b'"index":0', b'"index":0,"finish_reason":null'),
        usual.replace(b'"content":"hi"', b'"cont\\u0065nt":"hi"'),
        usual.replace(b'"hi"', b'"\\ud83d\\ude00"'),
        usual.replace(b'"hi"', b'""'),
        usual.replace(b'"hi"', b"7"),
        usual.replace(b'"id":"c"', b'"created":123456789012345678901234'),
        usual + b" x",
        usual + b" \t",
        usual.replace(b"}]}", b"},{}]}"),
        usual.replace(b'"hi"', b'"\xff"'),
        usual.replace(b'"hi"', b'"caf\xc3\xa9"'),
        usual.replace(b'"delta":{', b'"delta":{"tool_calls":null,"reasoning":"r",'),
    ]
    for payload in twists:
        read_both([head, b"data: " + payload + b"\n\n"])


def test_each_hot_module_exports_exactly_the_function_list() -> None:
    twins = [_hotpath_py, *([built] if (built := compiled()) is not None else [])]
    for module in twins:
        assert sorted(module.__all__) == sorted(hotpath.HOT_FUNCTIONS), module.__name__
        defined = {
            name
            for name, value in vars(module).items()
            if not name.startswith("_")
            and callable(value)
            and getattr(value, "__module__", None) == module.__name__
        }
        assert defined == set(hotpath.HOT_FUNCTIONS), module.__name__
