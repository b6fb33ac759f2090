"""A settled `MeasuredRequest` made by hand, for tests of what reads one (the record, the
metrics) without a request going through the middleware."""

from __future__ import annotations

import asyncio

from middleware import ScriptedClock
from middleware.request.exchange import Exchange
from middleware.request.measured import MeasuredRequest
from middleware.request.timeline import RequestTimeline
from middleware.types import Message


async def _no_receive() -> Message:
    raise AssertionError("a hand-made request receives nothing")


async def _no_send(message: Message) -> None:
    raise AssertionError("a hand-made request sends nothing")


def settled_request(
    tier: str,
    route: str,
    outcome: str = "ok",
    *,
    status: int = 200,
    stream: bool = True,
    input_tokens: int = 0,
    timeline: RequestTimeline | None = None,
    body: bytes | None = None,
) -> MeasuredRequest:
    """A request as `MeasuredRequest.settle` leaves it: its tier, route, outcome and status;
    with `body`, the request body it was sent, read through the exchange (which keeps it for
    the gen_ai.* attributes). Not from inside a running event loop when `body` is given."""
    if timeline is None:
        timeline = RequestTimeline.begin("r1", ScriptedClock())
    timeline.input_tokens = input_tokens or timeline.input_tokens
    replay: list[Message] = []
    if body is not None:
        replay.append({"type": "http.request", "body": body, "more_body": False})
    exchange = Exchange(
        timeline, _no_receive, _no_send, lambda: 0, replay=replay, keep_request=body is not None
    )
    if body is not None:
        asyncio.run(exchange.receive())
    exchange.is_stream = stream
    request = MeasuredRequest(exchange, timeline, {}, tier, route, {}, None, None)
    request.outcome, request.status = outcome, status
    return request
