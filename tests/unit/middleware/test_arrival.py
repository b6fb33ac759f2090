"""The first byte a server hands over (`middleware.request.arrival`) is taken only when it is
plausible: an int of the middleware's clock, not after the call, not an hour before it."""

from __future__ import annotations

from typing import Any

import pytest

from middleware import ScriptedClock
from middleware.request.arrival import (
    EXTENSION,
    arrival_fields,
    first_byte,
    put_first_byte,
    start_at_first_byte,
)
from middleware.request.timeline import RequestTimeline

NOW_NS = 5_000_000_000_000


@pytest.mark.parametrize(
    "told",
    [
        None,
        "1",
        {"at_ns": 1.5},
        {"at_ns": NOW_NS + 1},  # after the call: not this clock's
        {"at_ns": NOW_NS - 3_601 * 1_000_000_000},  # over an hour before the call
        {"at_ns": True},
    ],
)
def test_an_implausible_first_byte_is_not_taken(told: Any) -> None:
    assert first_byte({"extensions": {EXTENSION: told}}, NOW_NS) is None
    assert first_byte({}, NOW_NS) is None


def test_a_plausible_first_byte_starts_the_clock_there() -> None:
    scope: dict[str, Any] = {}
    put_first_byte(scope, NOW_NS - 40_000_000, NOW_NS - 90_000_000)
    assert first_byte(scope, NOW_NS) == (NOW_NS - 40_000_000, NOW_NS - 90_000_000)
    timeline = RequestTimeline.begin("r", ScriptedClock(start_ns=NOW_NS, wall_s=100.0))
    start_at_first_byte(timeline, scope)
    assert timeline.start_ns == NOW_NS - 40_000_000 and timeline.app_call_ns == NOW_NS
    assert timeline.wall_start_s == pytest.approx(99.96)
    clock_start, before_app_s, connection_s = arrival_fields(timeline)
    assert clock_start == "first_byte"
    assert (before_app_s, connection_s) == pytest.approx((0.04, 0.05))


def test_without_a_first_byte_the_clock_starts_at_the_call() -> None:
    timeline = RequestTimeline.begin("r", ScriptedClock(start_ns=NOW_NS))
    start_at_first_byte(timeline, {"extensions": {}})
    assert timeline.start_ns == NOW_NS and arrival_fields(timeline) == ("asgi_call", None, None)
    scope: dict[str, Any] = {}
    put_first_byte(scope, NOW_NS - 1, NOW_NS + 5)  # an accept after the byte is left out
    assert first_byte(scope, NOW_NS) == (NOW_NS - 1, None)
