"""The mounted middleware takes engine spans at POST /v1/traces and joins them to its records:
a span that came first is used at once, a late one is waited for, none at all leaves the
record as the wire tells it; the phases always add up to e2e."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from middleware import LatencyMiddleware, ScriptedClock
from middleware.config import MiddlewareConfig
from slo.sli import PHASES
from slo.store import RecordStore
from tests.helpers.scripted_stream import TRACE, TRACEPARENT, call, only_record, vllm_style_app


def export(trace_id: str, queue_s: float, prefill_s: float, decode_s: float) -> bytes:
    attributes = {
        "gen_ai.latency.time_in_queue": queue_s,
        "gen_ai.latency.time_in_model_prefill": prefill_s,
        "gen_ai.latency.time_in_model_decode": decode_s,
        "gen_ai.usage.completion_tokens": 6,
    }
    span = {
        "traceId": trace_id,
        "spanId": "00f067aa0ba902b7",
        "name": "llm_request",
        "attributes": [{"key": k, "value": {"doubleValue": v}} for k, v in attributes.items()],
    }
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()


async def post_traces(app: Any, body: bytes, content_type: bytes = b"application/json") -> int:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/traces",
        "headers": [(b"content-type", content_type)],
    }
    await app(scope, receive, send)
    return int(sent[0]["status"])


def assert_additive(record: Any) -> None:
    parts = sum(getattr(record, f"{phase}_s") or 0.0 for phase in PHASES)
    assert math.isclose(parts, record.e2e_s, abs_tol=1e-9)


def test_a_span_that_came_before_the_response_ended_splits_the_record(
    store: RecordStore,
) -> None:
    """vLLM ends its span when the engine finishes, which can be before the last HTTP byte:
    the engine's export reaches /v1/traces while the request is still in flight."""
    clock = ScriptedClock()
    inner = vllm_style_app(clock, [])
    app: LatencyMiddleware

    async def engine(scope: Any, receive: Any, send: Any) -> None:
        assert await post_traces(app, export(TRACE, 0.012, 0.02, 0.025)) == 200
        await inner(scope, receive, send)

    app = LatencyMiddleware(
        engine, store=store, clock=clock, config=MiddlewareConfig.of(expect="always")
    )
    stray = export("2" * 32, 0.5, 0.5, 0.5)  # a trace no request of ours is under

    async def scenario() -> None:
        assert await post_traces(app, stray) == 200
        await call(app, clock, {"messages": [], "stream": True}, TRACEPARENT)

    asyncio.run(scenario())
    record = only_record(store)
    phases = (record.queue_s, record.prefill_s, record.decode_s)
    assert all(
        math.isclose(a, b, abs_tol=1e-9) for a, b in zip(phases, (0.012, 0.02, 0.025), strict=True)
    )
    assert record.queue_prefill_s is None and record.trace_id == TRACE
    assert_additive(record)
    counts = app.span_join.counts
    assert (counts.joined, counts.unmatched, app.span_join.held) == (1, 1, 0)


def test_a_late_span_is_waited_for_and_none_leaves_the_wire_split(store: RecordStore) -> None:
    clock = ScriptedClock()
    app = LatencyMiddleware(
        vllm_style_app(clock, []),
        store=store,
        clock=clock,
        config=MiddlewareConfig.of(expect="always"),
    )
    other = "1" * 32

    async def scenario() -> None:
        await call(app, clock, {"messages": [], "stream": True}, TRACEPARENT)
        await call(
            app,
            clock,
            {"messages": [], "stream": True},
            [(b"traceparent", f"00-{other}-b7ad6b7169203331-01".encode())],
        )
        store.flush()
        assert store.query() == []  # both wait for their engine spans
        assert await post_traces(app, export(TRACE, 0.01, 0.02, 0.03)) == 200
        assert await post_traces(app, b"garbage", b"application/x-protobuf") == 400

    asyncio.run(scenario())
    store.flush()
    (joined,) = store.query()
    assert joined.trace_id == TRACE and math.isclose(joined.queue_s or 0, 0.01, abs_tol=1e-9)
    assert math.isclose(joined.decode_s, 0.03, abs_tol=1e-9)
    app.close()  # shutdown: the one still waiting is written without its span
    waited = [record for record in store.query() if record.trace_id == other]
    assert len(waited) == 1 and waited[0].queue_prefill_s is not None
    assert waited[0].queue_s is None
    for record in store.query():
        assert_additive(record)
    counts = app.span_join.counts
    assert (counts.joined, counts.waited_in_vain, counts.rejected) == (1, 1, 1)


def test_waits_share_one_timer_however_many_requests_wait(store: RecordStore) -> None:
    """Each finished request waits for its span; the waits end in the order they began, so
    one timer serves them all. A timer per request re-armed itself after each firing while
    others still waited: under steady traffic the timers piled up and the proxy spent a
    tenth of its CPU firing them."""
    clock = ScriptedClock()
    app = LatencyMiddleware(
        vllm_style_app(clock, []),
        store=store,
        clock=clock,
        config=MiddlewareConfig.of(expect="always", wait_s=0.05),
    )
    expiries = 0
    expire = app.span_join.expire

    def counted_expire() -> float | None:
        nonlocal expiries
        expiries += 1
        return expire()

    app.span_join.expire = counted_expire  # type: ignore[method-assign]
    requests = 40

    async def scenario() -> None:
        for index in range(requests):
            trace = f"{index + 1:032x}"
            await call(
                app,
                clock,
                {"messages": [], "stream": True},
                [(b"traceparent", f"00-{trace}-b7ad6b7169203331-01".encode())],
            )
            await asyncio.sleep(0.002)  # the waits end at 40 different moments
        await asyncio.sleep(0.3)  # every wait is over

    asyncio.run(scenario())
    store.flush()
    assert len(store.query()) == requests  # each written once, without a span
    assert app.span_join.counts.waited_in_vain == requests
    # One firing per moment a wait ends at most (and a re-arm when uvloop fires early).
    assert expiries <= 2 * requests, expiries
