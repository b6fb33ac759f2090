"""What the middleware hands clients about a request: the SSE timings comment and the
Server-Timing header, and the breakdown they are made from."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from middleware import ScriptedClock
from middleware.request.reporting import server_timing_value, timings_comment
from middleware.request.timeline import Breakdown, RequestTimeline
from slo.sli import PHASES

PREFIX = b": llm-slo-timings "
seconds = st.floats(min_value=0, max_value=1e5, allow_nan=False)
maybe_seconds = st.none() | seconds


@st.composite
def breakdowns(draw: st.DrawFn) -> Breakdown:
    return Breakdown(
        e2e_s=draw(seconds),
        ttft_s=draw(maybe_seconds),
        tpot_s=draw(maybe_seconds),
        itl_s=(),
        network_s=draw(seconds),
        queue_s=draw(maybe_seconds),
        prefill_s=draw(maybe_seconds),
        decode_s=draw(seconds),
        detokenize_s=draw(seconds),
        other_s=draw(seconds),
        output_tokens=draw(st.integers(min_value=0, max_value=10**6)),
    )


@given(breakdowns())
def test_timings_comment_is_json_with_the_rounded_seconds(breakdown: Breakdown) -> None:
    comment = timings_comment(breakdown)
    assert comment.startswith(PREFIX) and comment.endswith(b"\n\n")
    parsed = json.loads(comment[len(PREFIX) :])
    # The numbers json.dumps gave for the values rounded to the microsecond, in that order.
    expected = {f"{name}_s": round(value, 6) for name, value in breakdown.phases.items()}
    expected["e2e_s"] = round(breakdown.e2e_s, 6)
    if breakdown.ttft_s is not None:
        expected["ttft_s"] = round(breakdown.ttft_s, 6)
    expected["output_tokens"] = breakdown.output_tokens
    assert parsed == expected
    assert list(parsed) == list(expected)


@given(breakdowns())
def test_server_timing_value_in_milliseconds(breakdown: Breakdown) -> None:
    parts = [f"{name};dur={value * 1000:.3f}" for name, value in breakdown.phases.items()]
    if breakdown.ttft_s is not None:
        parts.append(f"ttft;dur={breakdown.ttft_s * 1000:.3f}")
    parts.append(f"e2e;dur={breakdown.e2e_s * 1000:.3f}")
    assert server_timing_value(breakdown) == ", ".join(parts)


def test_phases_are_listed_in_phases_order() -> None:
    breakdown = Breakdown(1.0, None, None, (), 0.1, None, None, 0.5, 0.1, 0.3, 0)
    assert tuple(breakdown.phases) == PHASES


def test_the_hot_path_breakdown_equals_a_constructed_one() -> None:
    clock = ScriptedClock()
    timeline = RequestTimeline.begin("r", clock)
    timeline.body_received(clock.advance_ms(1))
    for _ in range(4):
        timeline.chunk_sent(clock.advance_ms(3))
    timeline.last_byte_ns = clock.advance_ms(1)
    made = timeline.breakdown()
    fields = {name: getattr(made, name) for name in Breakdown.__dataclass_fields__}
    assert made == Breakdown(**fields)
    assert hash(made) == hash(Breakdown(**fields))


def test_a_later_breakdown_sees_marks_added_since_the_first() -> None:
    """The gaps are cached between a response's two breakdowns, never past a new mark."""
    clock = ScriptedClock()
    timeline = RequestTimeline.begin("r", clock)
    timeline.chunk_sent(clock.advance_ms(10))
    timeline.chunk_sent(clock.advance_ms(4))
    first = timeline.breakdown()
    timeline.chunk_sent(clock.advance_ms(6))
    timeline.last_byte_ns = clock.advance_ms(1)
    second = timeline.breakdown()
    assert first.output_tokens == 2 and second.output_tokens == 3
    assert second.itl_s == (0.004, 0.006)
    assert second.decode_s == 0.01 and second.network_s == 0.001

    engine = RequestTimeline.begin("e", clock)
    engine.mark("enqueue")
    engine.mark("schedule")
    engine.mark("token", clock.advance_ms(5))
    engine.mark("token", clock.advance_ms(2))
    assert engine.breakdown().itl_s == (0.002,)
    engine.mark("token", clock.advance_ms(3))
    assert engine.breakdown().itl_s == (0.002, 0.003)


def test_chunks_before_the_first_token_byte_are_not_tokens() -> None:
    clock = ScriptedClock()
    timeline = RequestTimeline.begin("r", clock)
    timeline.chunk_sent(clock.advance_ms(1))  # sent before the request body was read
    timeline.body_received(clock.advance_ms(5))
    timeline.chunk_sent(clock.advance_ms(10))
    timeline.chunk_sent(clock.advance_ms(2))
    timeline.last_byte_ns = clock.advance_ms(1)
    breakdown = timeline.breakdown()
    # The first byte clamps to the end of the request body: the early chunk is not counted.
    assert breakdown.output_tokens == 2 and breakdown.itl_s == (0.002,)
