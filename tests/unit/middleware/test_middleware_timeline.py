"""The middleware's timeline with a scripted clock and engine: exact phases, no shared state."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from middleware import LatencyMiddleware, ScriptedClock, current_timeline
from middleware.config import MiddlewareConfig
from middleware.request.timeline import RequestTimeline
from slo.spec import SLOSpec
from slo.store import RecordStore
from tests.helpers.hotpath import each_hotpath  # noqa: F401  (runs each test on both hot paths)
from tests.helpers.record_samples import phase_parts

MS = 1e-3


def scripted_engine_app(
    clock: ScriptedClock, tokens: int, gap_ms: float = 10.0, yield_between: bool = False
) -> Any:
    """An ASGI app that reports engine phases through `current_timeline()` on a scripted clock."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        clock.advance_ms(1)  # parse and validate: "other"
        timeline = current_timeline()
        assert timeline is not None
        timeline.mark("enqueue", tokens=7)
        clock.advance_ms(5)  # waiting for a slot
        timeline.mark("schedule")
        timeline.mark("prefill_start")
        clock.advance_ms(20)
        timeline.mark("prefill_end")
        timeline.mark("token")
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": b"data: 0\n\n", "more_body": True})
        for index in range(1, tokens):
            if yield_between:
                await asyncio.sleep(0)
            clock.advance_ms(gap_ms - 1)
            timeline.mark("token")
            timeline.mark("detokenize", duration_ns=1_000_000)
            await send(
                {
                    "type": "http.response.body",
                    "body": f"data: {index}\n\n".encode(),
                    "more_body": True,
                }
            )
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


async def call(
    app: Any,
    clock: ScriptedClock,
    headers: list[tuple[bytes, bytes]] | None = None,
    path: str = "/v1/completions",
    send_ms: float = 1.0,
) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        clock.advance_ms(2)  # the body arrives over the network
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            clock.advance_ms(send_ms)
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers or [], "state": {}}
    await app(scope, receive, send)
    return sent


def test_every_phase_exact_and_additive(store: RecordStore) -> None:
    clock = ScriptedClock()
    app = LatencyMiddleware(
        scripted_engine_app(clock, tokens=3),
        store=store,
        clock=clock,
        model="m",
        config=MiddlewareConfig.of(server_timing=False),
    )
    asyncio.run(call(app, clock, headers=[(b"x-llm-tier", b"premium")]))
    store.flush()
    (record,) = store.query()
    # Script: receive 2 ms, parse 1, queue 5, prefill 20: first token at 28 ms, its chunk sent
    # 28..29; two more tokens at 38 and 48 (1 ms detokenize each), each sent in 1 ms; the final
    # empty send ends at 50.
    assert record.tier == "premium" and record.outcome == "ok" and record.stream
    assert record.e2e_s == pytest.approx(50 * MS)
    assert record.network_s == pytest.approx((2 + 2) * MS)
    assert record.other_s == pytest.approx(1 * MS)
    assert record.queue_s == pytest.approx(5 * MS)
    assert record.prefill_s == pytest.approx(20 * MS)
    assert record.detokenize_s == pytest.approx(2 * MS)
    assert record.decode_s == pytest.approx((20 - 2) * MS)
    assert record.ttft_s == pytest.approx(28 * MS)
    assert record.tpot_s == pytest.approx((50 - 28) / 2 * MS)
    assert record.itl_s == pytest.approx([10 * MS, 10 * MS])
    assert record.input_tokens == 7 and record.output_tokens == 3
    parts = phase_parts(record)
    assert sum(parts) == pytest.approx(record.e2e_s)


def test_preemption_adds_queue_time_not_prefill() -> None:
    clock = ScriptedClock()
    timeline = RequestTimeline.begin("r", clock)
    timeline.body_received(clock.advance_ms(1))
    timeline.mark("enqueue", clock.advance_ms(1))
    timeline.mark("schedule", clock.advance_ms(4))
    timeline.mark("token", clock.advance_ms(10))  # first token at 16
    timeline.mark("token", clock.advance_ms(5))  # 21
    timeline.mark("schedule", clock.advance_ms(30))  # preempted, resumed at 51
    timeline.mark("token", clock.advance_ms(8))  # 59: the gap 21..59 is queue
    timeline.body_sent(clock.ns, clock.advance_ms(1), True)
    breakdown = timeline.breakdown()
    assert breakdown.queue_s == pytest.approx((4 + 38) * MS)
    assert breakdown.prefill_s == pytest.approx(10 * MS)
    assert breakdown.decode_s == pytest.approx(5 * MS)
    assert sum(breakdown.phases.values()) == pytest.approx(breakdown.e2e_s)
    assert all(value >= 0 for value in breakdown.phases.values())


def test_without_engine_bridge_chunks_give_ttft_and_itl(store: RecordStore) -> None:
    clock = ScriptedClock()

    async def plain_stream(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        clock.advance_ms(30)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for _ in range(4):
            await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
            clock.advance_ms(4)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    app = LatencyMiddleware(
        plain_stream, store=store, clock=clock, config=MiddlewareConfig.of(server_timing=False)
    )
    asyncio.run(call(app, clock, send_ms=0))
    store.flush()
    (record,) = store.query()
    assert record.ttft_s == pytest.approx(32 * MS)  # 2 ms receive + 30 ms of server work
    assert record.itl_s == pytest.approx([4 * MS] * 3)
    assert record.queue_s is None and record.prefill_s is None
    # No engine said how its 30 ms split: queue and prefill, not split; never "other".
    assert record.queue_prefill_s == pytest.approx(30 * MS)
    assert record.other_s == 0
    assert record.output_tokens == 4
    assert record.tokens_source == "chunks"
    assert sum(
        [record.network_s, record.queue_prefill_s, record.decode_s, record.detokenize_s]
    ) == pytest.approx(record.e2e_s)


def test_interleaved_streams_never_mix_state(store: RecordStore) -> None:
    clock = ScriptedClock()
    lengths = [2, 9, 4, 7, 1, 5]

    async def routed(scope: Any, receive: Any, send: Any) -> None:
        tokens = int(dict(scope["headers"])[b"x-tokens"])
        await scripted_engine_app(clock, tokens, yield_between=True)(scope, receive, send)

    app = LatencyMiddleware(
        routed, store=store, clock=clock, config=MiddlewareConfig.of(server_timing=False)
    )

    async def all_at_once() -> None:
        await asyncio.gather(
            *(call(app, clock, headers=[(b"x-tokens", str(n).encode())]) for n in lengths)
        )

    asyncio.run(all_at_once())
    store.flush()
    records = store.query()
    assert sorted(r.output_tokens for r in records) == sorted(lengths)
    assert len({r.request_id for r in records}) == len(lengths)
    for record in records:
        assert len(record.itl_s or []) == record.output_tokens - 1
        parts = phase_parts(record)
        assert sum(parts) == pytest.approx(record.e2e_s)
        assert min(parts) >= 0


def test_tier_resolution_and_bounded_routes(store: RecordStore) -> None:
    clock = ScriptedClock()
    seen: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(dict(scope["state"]))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    middleware = LatencyMiddleware(app, store=store, clock=clock, spec=SLOSpec.default())
    asyncio.run(call(middleware, clock, headers=[(b"x-llm-tier", b"batch")]))
    asyncio.run(call(middleware, clock, headers=[(b"x-llm-tier", b"no-such-tier")]))
    asyncio.run(call(middleware, clock, path="/random/path/123"))
    assert [s.get("tier") for s in seen] == ["batch", "standard", None]
    assert seen[0]["priority"] == 2 and seen[1]["priority"] == 1
    store.flush()
    assert len(store.query()) == 2  # the unknown path is passed through, not measured


def test_the_gateways_objective_header_picks_the_tier(store: RecordStore) -> None:
    """Behind the Gateway API Inference Extension: the InferenceObjective's name in
    x-gateway-inference-objective is the tier (the packaged spec names none: its own names)."""
    clock = ScriptedClock()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    middleware = LatencyMiddleware(app, store=store, clock=clock, spec=SLOSpec.default())
    for objective in (b"premium", b"batch", b"unknown"):
        headers = [(b"x-gateway-inference-objective", objective)]
        asyncio.run(call(middleware, clock, headers=headers))
    store.flush()
    assert sorted(r.tier for r in store.query()) == ["batch", "premium", "standard"]


@pytest.mark.parametrize(
    ("status", "hint", "expected"),
    [
        (200, None, "ok"),
        (400, None, "client_error"),
        (429, None, "rate_limited"),
        (429, "shed", "shed"),
        (503, None, "shed"),
        (504, None, "timeout"),
        (500, None, "server_error"),
    ],
)
def test_outcomes_from_status(
    store: RecordStore, status: int, hint: str | None, expected: str
) -> None:
    clock = ScriptedClock()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if hint:
            scope["state"]["outcome"] = hint
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    asyncio.run(call(LatencyMiddleware(app, store=store, clock=clock), clock))
    store.flush()
    (record,) = store.query()
    assert record.outcome == expected and record.status_code == status
    assert record.ttft_s is None if status >= 400 else record.ttft_s is not None


def test_app_exception_is_recorded_as_server_error(store: RecordStore) -> None:
    clock = ScriptedClock()

    async def broken(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        asyncio.run(call(LatencyMiddleware(broken, store=store, clock=clock), clock))
    store.flush()
    (record,) = store.query()
    assert record.outcome == "server_error" and record.status_code == 500


def test_disconnect_is_cancelled(store: RecordStore) -> None:
    clock = ScriptedClock()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        message = await receive()
        assert message["type"] == "http.disconnect"

    async def run() -> None:
        async def receive() -> dict[str, Any]:
            return {"type": "http.disconnect"}

        async def send(message: Any) -> None:
            return None

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/completions",
            "headers": [],
            "state": {},
        }
        await LatencyMiddleware(app, store=store, clock=clock)(scope, receive, send)

    asyncio.run(run())
    store.flush()
    (record,) = store.query()
    assert record.outcome == "cancelled"


def test_server_timing_header_and_final_sse_comment() -> None:
    clock = ScriptedClock()
    app = LatencyMiddleware(scripted_engine_app(clock, tokens=3), store=None, clock=clock)
    sent = asyncio.run(call(app, clock))
    bodies = [m.get("body", b"") for m in sent if m["type"] == "http.response.body"]
    comment = bodies[-1]  # with the stream's end, in one write
    assert sent[-1]["type"] == "http.response.body" and not sent[-1].get("more_body", False)
    assert comment.startswith(b": llm-slo-timings {") and comment.endswith(b"\n\n")
    timings = json.loads(comment[len(b": llm-slo-timings ") :])
    assert timings["prefill_s"] == 0.02 and timings["output_tokens"] == 3

    async def plain(scope: Any, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": b"{}"})

    sent = asyncio.run(call(LatencyMiddleware(plain, store=None, clock=clock), clock))
    headers = dict(sent[0]["headers"])
    assert b"e2e;dur=" in headers[b"server-timing"]
