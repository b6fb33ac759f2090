"""The OpenAI wire parser: token events, usage, timings, stripping; any split of the bytes."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from middleware.upstream import UpstreamReport, apply_timings
from middleware.upstream.engines.tgi import apply_tgi_headers
from middleware.wire.reader import WireReader
from tests.helpers.hotpath import each_hotpath  # noqa: F401  (runs each test on both hot paths)


def sse(data: Any) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def delta(**fields: Any) -> bytes:
    return sse({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": fields}]})


VLLM_STREAM = [
    delta(role="assistant", content=""),  # vLLM: the role chunk, after prefill, no text
    delta(content="Hello"),
    delta(content=" wor"),
    delta(content="ld, two"),  # a busy server batches several tokens into one delta
    sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}),
    sse({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 7,
                                  "prompt_tokens_details": {"cached_tokens": 4}}}),
    b"data: [DONE]\n\n",
]  # fmt: skip


def feed_all(reader: WireReader, pieces: list[bytes]) -> tuple[list[int], bytes]:
    events, out = [], b""
    for piece in pieces:
        count, sent = reader.feed(piece)
        events.append(count)
        out += sent
    return events, out + reader.flush()


def test_only_chunks_with_text_are_token_events() -> None:
    reader = WireReader()
    events, _ = feed_all(reader, VLLM_STREAM)
    assert events == [0, 1, 1, 1, 0, 0, 0]
    assert reader.output_tokens == 7 and reader.tokens_source == "usage"
    assert (reader.report.input_tokens, reader.report.cached_tokens) == (9, 4)


def test_role_null_content_tool_calls_and_reasoning() -> None:
    reader = WireReader()
    pieces = [
        delta(role="assistant"),  # llama-cpp-python: no content key
        delta(role="assistant", content=None),  # llama-server: content null
        delta(tool_calls=[{"index": 0, "function": {"name": "f", "arguments": ""}}]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '{"a":'}}]),
        delta(reasoning_content="think"),
        sse({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}),
        b": a comment\n\n",
        sse({"choices": [{"index": 0, "text": "x"}]}),
    ]
    events, _ = feed_all(reader, pieces)
    assert events == [0, 0, 0, 1, 1, 0, 0, 1]
    assert reader.output_tokens == 3 and reader.tokens_source == "chunks"


def test_llama_server_timings_give_counts_and_prefill() -> None:
    reader = WireReader()
    final = sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                 "timings": {"prompt_n": 5, "prompt_ms": 12.5, "predicted_n": 16,
                             "predicted_ms": 80.0, "cache_n": 3}})  # fmt: skip
    feed_all(reader, [delta(content="a"), final, b"data: [DONE]\n\n"])
    assert reader.output_tokens == 16 and reader.tokens_source == "timings"
    assert reader.report.prefill_s == 0.0125 and reader.report.decode_s == 0.08
    assert (reader.report.input_tokens, reader.report.cached_tokens) == (8, 3)


def test_usage_wins_over_timings() -> None:
    report = UpstreamReport()
    reader = WireReader()
    reader.report = report
    feed_all(reader, [sse({"choices": [], "usage": {"completion_tokens": 4}})])
    apply_timings(report, {"predicted_n": 9})
    assert (report.output_tokens, report.tokens_source) == (4, "usage")


def test_tgi_headers_split_inference_into_prefill_and_decode() -> None:
    report = UpstreamReport()
    headers = {b"x-queue-time": b"7", b"x-inference-time": b"100", b"x-time-per-token": b"6",
               b"x-generated-tokens": b"16", b"x-prompt-tokens": b"4"}  # fmt: skip
    assert apply_tgi_headers(report, headers)
    assert report.queue_s == 0.007
    assert report.decode_s == 0.090 and report.prefill_s == 0.010
    assert (report.output_tokens, report.input_tokens) == (16, 4)
    assert not apply_tgi_headers(UpstreamReport(), {b"x-compute-type": b"gpu"})


def test_a_plain_body_reads_usage() -> None:
    reader = WireReader()
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 16}}  # fmt: skip
    assert reader.read_body(json.dumps(body).encode())
    assert reader.output_tokens == 16
    assert not WireReader().read_body(b'{"error": {"message": "bad"}}')
    assert not WireReader().read_body(b"not json")


def test_stripping_takes_out_the_usage_chunk_and_usage_nulls() -> None:
    with_nulls = [piece.replace(b"}]}", b'}],"usage":null}') for piece in VLLM_STREAM]
    reader = WireReader(strip_usage=True)
    _, out = feed_all(reader, with_nulls)
    assert out == b"".join(piece for piece in VLLM_STREAM if b'"usage"' not in piece)
    assert reader.output_tokens == 7


TIMINGS = {"cache_n": 0, "prompt_n": 56, "prompt_ms": 2.524, "predicted_n": 1, "predicted_ms": 0.1}
FINISH = {"choices": [{"finish_reason": "length", "index": 0, "delta": {}}], "id": "chatcmpl-1"}


def test_stripping_puts_llama_servers_timings_back_on_the_finish_chunk() -> None:
    """Observed: asked for usage, llama-server moves `timings` from the finish chunk into the
    usage chunk. The client did not ask: it gets the stream it would have got unasked, the
    finish chunk carrying `timings`, and no usage chunk."""
    asked = [
        delta(role="assistant", content=None),
        delta(content="S"),
        sse(FINISH),
        sse({"choices": [], "id": "chatcmpl-1", "usage": {"prompt_tokens": 56,
             "completion_tokens": 1}, "timings": TIMINGS}),
        b"data: [DONE]\n\n",
    ]  # fmt: skip
    unasked = [*asked[:2], sse({**FINISH, "timings": TIMINGS}), asked[-1]]
    for pieces in (asked, [b"".join(asked)], [b"".join(asked[:3]), *asked[3:]]):
        reader = WireReader(strip_usage=True)
        _, out = feed_all(reader, pieces)
        assert out == b"".join(unasked)
        assert reader.output_tokens == 1 and reader.tokens_source == "usage"


def test_a_held_finish_chunk_goes_out_at_the_end_when_no_usage_follows() -> None:
    """An engine that ignores `include_usage`: the held finish chunk goes on before [DONE], or
    with the flush when the stream ends without one."""
    stream = [delta(content="Hi"), sse(FINISH), b"data: [DONE]\n\n"]
    _, out = feed_all(WireReader(strip_usage=True), stream)
    assert out == b"".join(stream)
    _, out = feed_all(WireReader(strip_usage=True), stream[:2])
    assert out == b"".join(stream[:2])


@given(st.lists(st.integers(min_value=1, max_value=40), max_size=30), st.booleans())
def test_any_split_of_the_bytes_reads_the_same(cuts: list[int], strip: bool) -> None:
    whole = b"".join(VLLM_STREAM).replace(b"\n\n", b"\r\n\r\n", 2)
    pieces, at = [], 0
    for size in cuts:
        if at < len(whole):
            pieces.append(whole[at : at + size])
            at += size
    pieces.append(whole[at:])
    reader = WireReader(strip_usage=strip)
    events, out = feed_all(reader, pieces)
    assert sum(events) == 3 and reader.output_tokens == 7
    if not strip:
        assert out == whole
    else:
        assert b'"usage"' not in out and out.count(b"data: ") == len(VLLM_STREAM) - 1


def test_a_piece_that_passes_as_is_is_sent_on_unchanged() -> None:
    """`passes_as_is` (the one-call offer's test) never lets through a piece `feed` would
    rewrite or hold: usage, a finish reason (spaced or not), a held finish chunk."""
    spaced = b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
    for strip in (False, True):
        reader = WireReader(strip_usage=strip)
        passed = []
        for piece in [*VLLM_STREAM[:4], spaced, delta(content="late"), *VLLM_STREAM[4:]]:
            if reader.passes_as_is(piece):
                passed.append(piece)
                assert reader.feed(piece)[1] == piece
            else:
                reader.feed(piece)
        # Every data event as it came; stripping, the four before the first finish chunk (the
        # chunk after a held finish goes through feed, which sends the held one first).
        assert len(passed) == (4 if strip else 8), passed
