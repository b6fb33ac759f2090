"""Which hot path runs and how to choose it, and the compiled functions against their
pure-Python twins on random input: the bucket search, the gaps between marks, the timeline's
chunk marks, the live-window update, the timings comment and the per-request bucket counts of
the histograms and the live windows."""

from __future__ import annotations

import os
import subprocess
import sys
from bisect import bisect_left
from collections import Counter
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from middleware import _hotpath_py, hotpath
from middleware.clock import ScriptedClock
from middleware.live.windows import NUM_SLOTS, WindowSet
from middleware.metrics.histograms import bucket_counts
from middleware.request.exchange import Exchange
from middleware.request.timeline import RequestTimeline
from middleware.wire.reader import WireReader
from tests.conftest import require_or_skip
from tests.helpers.hotpath import using

SELECTED = "import middleware.hotpath as h; print(h.IMPLEMENTATION)"


def compiled() -> Any:
    built = hotpath.compiled()
    if built is None:
        require_or_skip("middleware._hotpath is not built: `pip install -e .` with a C compiler")
    return built


def chosen(**env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", SELECTED],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout.strip()


def test_the_compiled_path_runs_unless_pure_python_is_asked_for() -> None:
    compiled()
    assert chosen(LLM_SLO_PURE_PYTHON="") == "compiled"
    assert chosen(LLM_SLO_PURE_PYTHON="0") == "compiled"
    assert chosen(LLM_SLO_PURE_PYTHON="1") == "pure-python"


def test_using_rebinds_every_hot_function() -> None:
    built = compiled()
    for name, module in (("pure-python", _hotpath_py), ("compiled", built)):
        with using(name):
            assert WireReader.token_events_in is module.token_events_in
            assert WireReader._decoded_has_text is module.decoded_has_text
            assert RequestTimeline.chunk_sent is module.chunk_sent
            assert Exchange.send is module.exchange_send
            assert hotpath.gaps_s is module.gaps_s
            assert hotpath.window_add is module.window_add
            assert hotpath.timings_comment is module.timings_comment
            assert hotpath.observe_values is module.observe_values
            assert hotpath.count_in_columns is module.count_in_columns
            from middleware.metrics import histograms
            from middleware.request import settle

            assert histograms.bucket_counts is settle.bucket_counts is module.bucket_counts


FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=64)
VALUES = st.lists(FLOATS | st.integers(-(2**60), 2**60) | st.booleans(), max_size=60)
# Seconds as a timeline makes them (ns * 1e-9), the ties "%.6f" rounds to even (k + 0.5
# millionths that a double holds exactly), the values either side of them, and anything else.
SECONDS = (
    st.integers(0, 10**15).map(lambda ns: ns * 1e-9)
    | st.integers(0, 2**20).map(lambda k: (2 * k + 1) / 2**7)
    | st.integers(0, 2**40).map(lambda k: float(np.nextafter((k + 0.5) / 1e6, np.inf)))
    | st.integers(0, 2**40).map(lambda k: float(np.nextafter((k + 0.5) / 1e6, -np.inf)))
    | st.sampled_from([0.0078125, -0.0, 0.0, 2.0**40 / 1e6, 1e300, -1.5, 5e-7])
    | FLOATS
    | st.integers(0, 10**9)
)
PHASE_NAMES = ("network_s", "queue_s", "prefill_s", "decode_s", "other_s")


@settings(max_examples=300, deadline=None)
@given(st.lists(FLOATS | st.integers(-100, 10**17), max_size=16), VALUES)
def test_bucket_search_agrees(bounds: list[Any], values: list[Any]) -> None:
    bounds.sort(key=lambda bound: (bound != bound, bound))  # NaNs last: any order is allowed
    assert compiled().bucket_counts(bounds, values) == _hotpath_py.bucket_counts(bounds, values)


@given(st.lists(st.floats(0.0, 100.0), max_size=80))
def test_bucket_search_places_values_as_prometheus_does(values: list[float]) -> None:
    bounds = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
    expected = Counter(bisect_left(bounds, value) for value in values)
    assert dict(bucket_counts(bounds, values)) == expected


MARKS = st.lists(st.integers(0, 2**62) | st.integers(-(2**70), 2**70), max_size=40)


@given(MARKS)
def test_gaps_agree(marks: list[int]) -> None:
    assert compiled().gaps_s(marks) == _hotpath_py.gaps_s(marks)


@given(
    st.lists(st.tuples(st.integers(0, 2**62), st.integers(0, 3)), max_size=30),
    st.lists(st.integers(0, 2**62), max_size=2),
    st.none() | st.integers(0, 2**62),
)
def test_chunk_marks_agree(
    chunks: list[tuple[int, int]], marks_before: list[int], first_before: int | None
) -> None:
    """Both paths leave the same marks and first token's byte, from any start (token marks
    already there or not, the first token's byte set or not, however inconsistent)."""
    clock = ScriptedClock()
    timelines = [RequestTimeline.begin("r", clock) for _ in range(2)]
    for timeline in timelines:
        timeline.token_chunk_ns.extend(marks_before)
        timeline.first_token_byte_ns = first_before
    for at, events in chunks:
        compiled().chunk_sent(timelines[0], at, events)
        _hotpath_py.chunk_sent(timelines[1], at, events)
    first, second = timelines
    assert first.body_chunk_ns == second.body_chunk_ns
    assert first.token_chunk_ns == second.token_chunk_ns
    assert first.first_token_byte_ns == second.first_token_byte_ns


WINDOWS = st.lists(st.sampled_from([60.0, 300.0, 600.0, 3600.0, 86400.0]), min_size=1, max_size=5)
STEPS = st.lists(
    st.tuples(
        st.floats(0.0, 400.0),
        st.lists(st.integers(0, 5), unique=True, max_size=6),
        st.floats(-5.0, 5.0),
    ),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(WINDOWS, STEPS, st.floats(0.0, 2e9))
def test_window_updates_agree(windows: list[float], steps: list[Any], start_s: float) -> None:
    sets = [WindowSet(windows, 6) for _ in range(2)]
    now_s = start_s
    for advance_s, columns, amount in steps:
        now_s += advance_s
        column_array = np.asarray(columns, dtype=np.int64)
        amounts = np.full(len(columns), amount)
        for windows_set, module in zip(sets, (compiled(), _hotpath_py), strict=True):
            args = (windows_set.counts, windows_set.slot_ids, windows_set.slot_s, now_s)
            module.window_add(*args, column_array, amounts)
    assert sets[0].counts.shape == (len(set(windows)), NUM_SLOTS, 6)
    np.testing.assert_array_equal(sets[0].counts, sets[1].counts)
    np.testing.assert_array_equal(sets[0].slot_ids, sets[1].slot_ids)


def test_window_update_falls_back_to_numpy_for_other_dtypes_and_indices() -> None:
    """int32 columns, int amounts and negative columns take numpy's rules, as before."""
    for columns, amounts in (
        (np.asarray([1, 3], dtype=np.int32), np.asarray([2, 5])),
        (np.asarray([-1]), np.asarray([1.5])),
    ):
        sets = [WindowSet([60.0, 600.0], 4) for _ in range(2)]
        for windows_set, module in zip(sets, (compiled(), _hotpath_py), strict=True):
            module.window_add(
                windows_set.counts, windows_set.slot_ids, windows_set.slot_s, 1e6, columns, amounts
            )
        np.testing.assert_array_equal(sets[0].counts, sets[1].counts)
        assert sets[0].counts.sum() == 2 * amounts.sum()


SSE_PIECES = st.sampled_from(
    [
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n',
        b'data: {"id":"c","choices":[{"delta":{"content":" a"},"finish_reason":null}]}\n\n',
        b'data: {"id":"c","choices":[{"delta":{"content":"\\"q"},"finish_reason":null}]}\n\n',
        b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n',
        b"data: [DONE]\n\n",
        b"data: [DO",
        b"NE]\n\n",
        b": ping\n\n",
        b'data: {"choices":[{"delta":{"content":"x"}}]}\n\ndata: {"choices":[{"delta"',
        b':{"content":"y"}}]}\n\n',
        b"",
    ]
)
MESSAGE = st.tuples(SSE_PIECES, st.booleans(), st.sampled_from(["dict", "other type", "mapping"]))


def left_by(exchange: Exchange) -> tuple[Any, ...]:
    """What an exchange's messages left: the timeline's marks, `delivered`, the wire's counts."""
    timeline, wire = exchange.timeline, exchange.wire
    return (
        timeline.body_chunk_ns,
        timeline.token_chunk_ns,
        timeline.first_token_byte_ns,
        timeline.last_byte_ns,
        exchange.delivered,
        (wire.events, wire.token_events, wire.done, wire.finished, wire.finish_reasons),
    )


def drive_exchange(
    name: str, content_type: bytes, strip_usage: bool, messages: list[tuple[bytes, bool, str]]
) -> tuple[Any, ...]:
    """Send the messages through an Exchange on implementation `name`: what went down, the
    timeline's marks and the wire's counts."""
    import asyncio
    from types import MappingProxyType

    sent: list[Any] = []

    async def below(message: Any) -> None:
        sent.append(dict(message))

    async def run() -> tuple[Any, ...]:
        clock = ScriptedClock()
        timeline = RequestTimeline.begin("r", clock)
        exchange = Exchange(timeline, None, below, clock.now_ns, replay=[], strip_usage=strip_usage)
        start = {"type": "http.response.start", "status": 200, "headers": []}
        start["headers"] = [(b"content-type", content_type)]
        await exchange.send(start)
        for body, more, kind in messages:
            clock.advance_ms(1)
            message: Any = {"type": "http.response.body", "body": body, "more_body": more}
            if kind == "other type":
                message = {"type": "http.response.trailers", "body": body, "more_body": more}
            elif kind == "mapping":
                message = MappingProxyType(message)
            await exchange.send(message)
        return (sent, *left_by(exchange), exchange.complete)

    with using(name):
        return asyncio.run(run())


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([b"text/event-stream", b"application/json"]),
    st.booleans(),
    st.lists(MESSAGE, max_size=10),
)
def test_exchange_send_agrees(
    content_type: bytes, strip_usage: bool, messages: list[tuple[bytes, bool, str]]
) -> None:
    """`Exchange.send` on either path passes the same messages down and leaves the same marks
    and counts, whatever the messages (stream or JSON, usage stripped or not, pieces cut
    anywhere, empty bodies, the last message anywhere, a message of another type or that is a
    mapping but not a dict)."""
    compiled()
    assert drive_exchange("compiled", content_type, strip_usage, messages) == drive_exchange(
        "pure-python", content_type, strip_usage, messages
    )


def drive_direct(
    name: str, pieces: list[tuple[bytes, bool]], through_send_only: bool, ticking: bool = False
) -> tuple[Any, ...]:
    """A stream's middle pieces on implementation `name`, each offered to the measured direct
    write (`middleware.request.exchange_direct`) over a server that is ready or not as scripted, and
    sent through `Exchange.send` where the offer is refused (as `slo proxy` does); or, with
    `through_send_only`, all sent. What reached the client, in order, the marks and counts;
    `ticking`: the exchange's clock moves 1 ns at every read, and each direct write also
    records the time it ran (last)."""
    import asyncio

    from middleware.request.exchange_direct import measured_direct_body
    from middleware.wire.direct_body import DirectBody

    out: list[bytes] = []
    server = {"ready": True}

    async def below(message: Any) -> None:
        if message.get("body"):
            out.append(message["body"])

    async def run() -> tuple[Any, ...]:
        clock = ScriptedClock()
        timeline = RequestTimeline.begin("r", clock)
        written_at: list[tuple[int, int]] = []

        def now_ns() -> int:
            clock.ns += ticking
            return clock.ns

        def write(body: bytes) -> None:
            clock.ns += ticking
            written_at.append((len(out), clock.ns))  # the piece's place among all, its time
            out.append(body)

        exchange = Exchange(timeline, None, below, now_ns, replay=[])
        start = {"type": "http.response.start", "status": 200}
        start["headers"] = [(b"content-type", b"text/event-stream")]
        offer = measured_direct_body(
            exchange, DirectBody(below, lambda: server["ready"], write)
        ).offer
        refused_before_start = offer(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n')
        await exchange.send(start)
        for body, ready in pieces:
            clock.advance_ms(1)
            server["ready"] = ready
            if through_send_only or not offer(body):
                await exchange.send({"type": "http.response.body", "body": body, "more_body": True})
        return (refused_before_start, out, *left_by(exchange), written_at)

    with using(name):
        return asyncio.run(run())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(SSE_PIECES.filter(bool), st.booleans()), max_size=12))
def test_a_direct_write_is_measured_as_a_sent_piece(pieces: list[tuple[bytes, bool]]) -> None:
    """On both paths, a piece the server takes straight from the offer leaves the same marks,
    counts and bytes, in the same order, as the same piece sent through `Exchange.send`; one
    refused (the server pushing back, or no stream yet) leaves nothing. (The upstream never
    offers an empty piece: httptools hands over body bytes only.)"""
    compiled()
    through_send = drive_direct("pure-python", pieces, through_send_only=True)
    for name in ("compiled", "pure-python"):
        direct = drive_direct(name, pieces, through_send_only=False)
        assert direct[0] is False  # before the response starts, it is not a stream yet
        assert direct[1:-1] == through_send[1:-1]
    # With a clock that moves at every read: both paths read it alike, and a piece written
    # directly is marked with a time read before the write ran.
    ticked = [
        drive_direct(name, pieces, False, ticking=True) for name in ("compiled", "pure-python")
    ]
    assert ticked[0] == ticked[1]
    body_marks, written_at = ticked[1][2], ticked[1][-1]
    assert len(body_marks) == len(ticked[1][1])  # one mark per piece, in the pieces' order
    for place, written in written_at:
        assert body_marks[place] < written
    assert len(written_at) == sum(1 for _, ready in pieces if ready)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(SECONDS, min_size=len(PHASE_NAMES), max_size=len(PHASE_NAMES)),
    SECONDS,
    SECONDS | st.none(),
    st.integers(0, 10**6) | st.integers(0, 10**4000),
)
def test_timings_comment_agrees(phases: list[Any], e2e: Any, ttft: Any, output_tokens: int) -> None:
    """Every number as "%.6f" writes it (correctly rounded, ties to even), on both paths."""
    built = compiled()
    breakdown = SimpleNamespace(e2e_s=e2e, ttft_s=ttft, output_tokens=output_tokens)
    seconds = tuple(phases)
    expected = _hotpath_py.timings_comment(breakdown, PHASE_NAMES, seconds)
    assert built.timings_comment(breakdown, PHASE_NAMES, seconds) == expected
    assert expected.startswith(b": llm-slo-timings {") and expected.endswith(b"}\n\n")
    assert b'"e2e_s":%.6f' % e2e in expected
    for name, value in zip(PHASE_NAMES, phases, strict=True):
        assert b'"%s":%.6f' % (name.encode(), value) in expected


BOUNDS = st.lists(FLOATS | st.integers(-(2**60), 2**60), max_size=12).map(sorted) | st.just([])
OBSERVED = FLOATS | st.integers(-(2**60), 2**60) | st.none()


def _series_plan(bounds: list[list[Any]], takes: list[bool]) -> list[tuple[Any, bool]]:
    from middleware.metrics.prom_export import HistogramSeries

    return [
        (HistogramSeries(tuple(each) if index % 2 else each), take)  # type: ignore[arg-type]
        for index, (each, take) in enumerate(zip(bounds, takes, strict=True))
    ]


@settings(max_examples=300, deadline=None)
@given(st.data(), st.integers(0, 6), st.sampled_from([None, "", "4bf92f3577b34da6"]))
def test_histogram_observations_agree(data: Any, size: int, trace_id: str | None) -> None:
    """Each value lands in the bucket `bisect_left` picks and in the sum, on both paths; a
    series that takes exemplars keeps the trace id."""
    built = compiled()
    bounds = [data.draw(BOUNDS) for _ in range(size)]
    takes = [data.draw(st.booleans()) for _ in range(size)]
    rounds = data.draw(st.lists(st.lists(OBSERVED, min_size=size, max_size=size), max_size=4))
    plans = [_series_plan(bounds, takes), _series_plan(bounds, takes)]
    for values in rounds:
        _hotpath_py.observe_values(plans[0], tuple(values), trace_id)
        built.observe_values(plans[1], tuple(values), trace_id)
    for (pure, _), (fast, _) in zip(*plans, strict=True):
        assert fast.counts == pure.counts
        assert str(fast.sum) == str(pure.sum)  # nan too
        assert [e and e[:2] for e in fast.exemplars] == [e and e[:2] for e in pure.exemplars]


@settings(max_examples=300, deadline=None)
@given(st.data(), st.integers(0, 6))
def test_live_column_counts_agree(data: Any, size: int) -> None:
    built = compiled()
    columns, start = [], 0
    for index in range(size):
        bounds = data.draw(BOUNDS)
        columns.append((f"field_{index}", start, tuple(bounds) if index % 2 else bounds))
        start += len(bounds) + 1
    rounds = data.draw(st.lists(st.lists(OBSERVED, min_size=size, max_size=size), max_size=4))
    pending: list[list[float]] = [[0.0] * start, [0.0] * start]
    for values in rounds:
        breakdown = SimpleNamespace(**{f"field_{i}": value for i, value in enumerate(values)})
        _hotpath_py.count_in_columns(pending[0], columns, breakdown)
        built.count_in_columns(pending[1], columns, breakdown)
    assert pending[1] == pending[0]
    assert sum(pending[0]) == sum(value is not None for values in rounds for value in values)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.text(min_size=1, max_size=40) | st.text(alphabet="é日🙂", min_size=600, max_size=900),
        min_size=1,
        max_size=4,
        unique=True,
    ),
    SECONDS,
)
def test_timings_comment_agrees_on_any_field_names(names: list[str], value: Any) -> None:
    """Long and non-ASCII names (more bytes than characters) and a huge token count go to the
    twin rather than past the compiled path's buffer. (Names are JSON keys written as they
    are, and the twin's template holds them: identifiers, as the record fields are.)"""
    built = compiled()
    names = [name for name in names if name.isidentifier()] or ["phase_s"]
    breakdown = SimpleNamespace(e2e_s=value, ttft_s=value, output_tokens=10**3000)
    seconds = (value,) * len(names)
    expected = _hotpath_py.timings_comment(breakdown, tuple(names), seconds)
    assert built.timings_comment(breakdown, tuple(names), seconds) == expected
    assert expected.endswith(b"0}\n\n")


def test_timings_comment_refuses_seconds_that_do_not_match_the_names() -> None:
    """Fewer seconds than names (or not a tuple) goes to the twin, which says so; never a
    read past the tuple."""
    built = compiled()
    breakdown = SimpleNamespace(e2e_s=1.0, ttft_s=None, output_tokens=3)
    for implementation in (built, _hotpath_py):
        with pytest.raises(TypeError):
            implementation.timings_comment(breakdown, ("a_s", "b_s"), (0.5,))
    assert built.timings_comment(breakdown, ("a_s",), [0.5]) == _hotpath_py.timings_comment(
        breakdown, ("a_s",), (0.5,)
    )
