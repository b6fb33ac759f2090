"""The middleware on engines it only sees through the wire: a scripted vLLM-style stream, plain
bodies with usage, llama.cpp timings, TGI headers, usage asked on the client's behalf, and
lifespan. A scripted clock makes every timing exact."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest

from middleware import LatencyMiddleware, ScriptedClock
from middleware.config import MiddlewareConfig
from slo.records import RequestRecord
from slo.sli import PHASES
from slo.store import RecordStore
from tests.helpers.hotpath import each_hotpath  # noqa: F401  (runs each test on both hot paths)
from tests.helpers.scripted_stream import call, chat_delta, only_record, sse, vllm_style_app

MS = 1e-3


def body_of(sent: list[dict[str, Any]]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def assert_additive(record: RequestRecord) -> None:
    parts = [getattr(record, f"{phase}_s") or 0.0 for phase in PHASES]
    assert sum(parts) == pytest.approx(record.e2e_s, abs=1e-9)
    assert all(part >= 0 for part in parts)


@pytest.mark.parametrize("inject", [False, True])
def test_a_vllm_style_stream_is_counted_right(store: RecordStore, inject: bool) -> None:
    clock = ScriptedClock()
    requests: list[dict[str, Any]] = []
    app = LatencyMiddleware(
        vllm_style_app(clock, requests),
        store=store,
        clock=clock,
        config=MiddlewareConfig.of(inject_usage=inject),
    )
    sent = asyncio.run(call(app, clock, {"model": "m", "messages": [], "stream": True}))
    record = only_record(store)
    # TTFT is the first text (2 ms body + 40 ms + 3 ms), not the empty role chunk at 42 ms.
    assert record.ttft_s == pytest.approx(45 * MS)
    assert record.itl_s == pytest.approx([10 * MS, 10 * MS])  # one gap per token event
    assert record.queue_prefill_s == pytest.approx(43 * MS) and record.other_s == 0
    assert record.queue_s is None and record.prefill_s is None
    assert_additive(record)
    if inject:
        # Asked on the client's behalf: exact, and the client never sees the usage chunk.
        assert requests[0]["stream_options"] == {"include_usage": True}
        assert (record.output_tokens, record.tokens_source) == (6, "usage")
        assert record.input_tokens == 5
        assert b'"usage"' not in body_of(sent)
        assert record.tpot_s == pytest.approx((record.e2e_s - record.ttft_s) / 5)
    else:
        assert "stream_options" not in requests[0]
        assert (record.output_tokens, record.tokens_source) == (3, "chunks")


def test_a_client_that_asked_for_usage_keeps_it(store: RecordStore) -> None:
    clock = ScriptedClock()
    app = LatencyMiddleware(
        vllm_style_app(clock, []),
        store=store,
        clock=clock,
        config=MiddlewareConfig.of(inject_usage=True),
    )
    body = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}
    sent = asyncio.run(call(app, clock, body))
    assert b'"completion_tokens":6' in body_of(sent)
    assert only_record(store).output_tokens == 6


def plain_app(clock: ScriptedClock, body: dict[str, Any], headers: list[Any]) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        clock.advance_ms(100)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), *headers]})  # fmt: skip
        await send({"type": "http.response.body", "body": json.dumps(body).encode()})

    return app


def test_a_plain_reply_counts_its_usage_not_one(store: RecordStore) -> None:
    clock = ScriptedClock()
    reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * 40}}],
             "usage": {"prompt_tokens": 8, "completion_tokens": 16,
                       "prompt_tokens_details": {"cached_tokens": 2}}}  # fmt: skip
    app = LatencyMiddleware(plain_app(clock, reply, []), store=store, clock=clock)
    asyncio.run(call(app, clock, {"model": "m", "messages": []}))
    record = only_record(store)
    assert (record.output_tokens, record.tokens_source) == (16, "usage")
    assert (record.input_tokens, record.cached_tokens) == (8, 2)
    assert record.queue_prefill_s == pytest.approx(100 * MS)
    assert_additive(record)


def test_llama_server_timings_split_prefill_from_queue(store: RecordStore) -> None:
    clock = ScriptedClock()
    reply = {"choices": [{"index": 0, "message": {"content": "abc"}}],
             "timings": {"prompt_n": 4, "prompt_ms": 30.0, "predicted_n": 12,
                         "predicted_ms": 50.0, "cache_n": 0}}  # fmt: skip
    app = LatencyMiddleware(plain_app(clock, reply, []), store=store, clock=clock)
    asyncio.run(call(app, clock, {"model": "m", "messages": []}))
    record = only_record(store)
    assert (record.output_tokens, record.tokens_source) == (12, "timings")
    assert record.prefill_s == pytest.approx(30 * MS)
    assert record.decode_s == pytest.approx(50 * MS)
    assert record.queue_s == pytest.approx(20 * MS)  # the rest of the 100 ms before the body
    assert record.queue_prefill_s is None
    assert_additive(record)


def test_tgi_headers_give_queue_prefill_and_decode(store: RecordStore) -> None:
    clock = ScriptedClock()
    reply = {"choices": [{"index": 0, "message": {"content": "abc"}}]}
    headers = [(b"x-queue-time", b"20"), (b"x-inference-time", b"70"),
               (b"x-time-per-token", b"7"), (b"x-generated-tokens", b"10")]  # fmt: skip
    app = LatencyMiddleware(plain_app(clock, reply, headers), store=store, clock=clock)
    asyncio.run(call(app, clock, {"model": "m", "messages": []}))
    record = only_record(store)
    assert record.queue_s == pytest.approx(20 * MS)
    assert record.decode_s == pytest.approx(63 * MS)  # 7 ms x 9 gaps
    assert record.prefill_s == pytest.approx(7 * MS)
    assert record.other_s == pytest.approx(10 * MS)  # neither queue nor inference: TGI's own
    assert record.output_tokens == 10
    assert_additive(record)


def test_a_proxy_splits_its_own_time_and_reaching_the_upstream(store: RecordStore) -> None:
    clock = ScriptedClock()

    async def proxy_like(scope: dict[str, Any], receive: Any, send: Any) -> None:
        from middleware import current_timeline

        await receive()
        timeline = current_timeline()
        assert timeline is not None
        clock.advance_ms(1)
        timeline.mark("upstream_start")
        clock.advance_ms(4)
        timeline.mark("upstream_connected")
        clock.advance_ms(50)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
        for text in ("a", "b"):
            await send({"type": "http.response.body", "body": chat_delta(content=text),
                        "more_body": True})  # fmt: skip
            clock.advance_ms(5)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    app = LatencyMiddleware(proxy_like, store=store, clock=clock)
    asyncio.run(call(app, clock, {"model": "m", "stream": True}))
    record = only_record(store)
    assert record.other_s == pytest.approx(1 * MS)
    assert record.network_s == pytest.approx((2 + 4 + 5) * MS)
    assert record.queue_prefill_s == pytest.approx(50 * MS)
    assert_additive(record)


def test_a_stream_in_another_format_counts_every_chunk(store: RecordStore) -> None:
    clock = ScriptedClock()

    async def plain_sse(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        clock.advance_ms(10)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
        for _ in range(3):
            await send({"type": "http.response.body", "body": b"data: tok\n\n", "more_body": True})
            clock.advance_ms(5)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    app = LatencyMiddleware(plain_sse, store=store, clock=clock)
    asyncio.run(call(app, clock, {}))
    record = only_record(store)
    assert (record.output_tokens, record.tokens_source) == (3, "chunks")
    assert record.itl_s == pytest.approx([5 * MS, 5 * MS])


def lifespan_run(app: Any) -> list[str]:
    async def go() -> list[str]:
        incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
        answers: list[str] = []

        async def receive() -> dict[str, Any]:
            return incoming.pop(0)

        async def send(message: dict[str, Any]) -> None:
            answers.append(message["type"])

        await app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
        return answers

    return asyncio.run(go())


@pytest.mark.parametrize("app_speaks_lifespan", [True, False])
def test_shutdown_flushes_every_record(tmp_path: Any, app_speaks_lifespan: bool) -> None:
    store = RecordStore(f"sqlite:///{tmp_path / 'r.db'}")
    clock = ScriptedClock()
    events: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            if not app_speaks_lifespan:
                raise RuntimeError("only http here")
            while True:
                message = await receive()
                events.append(message["type"])
                kind = message["type"].removeprefix("lifespan.")
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        await plain_app(clock, {"choices": []}, [])(scope, receive, send)

    middleware = LatencyMiddleware(app, store=store, clock=clock)
    for _ in range(5):
        asyncio.run(call(middleware, clock, {}))
    answers = lifespan_run(middleware)
    assert answers == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    if app_speaks_lifespan:
        assert events == ["lifespan.startup", "lifespan.shutdown"]
    reopened = RecordStore(f"sqlite:///{tmp_path / 'r.db'}")
    assert len(reopened.query()) == 5  # written by the shutdown, with no flush() of ours
    reopened.close()


@pytest.mark.parametrize("raises", [False, True])
def test_a_client_that_leaves_after_done_got_everything(store: RecordStore, raises: bool) -> None:
    """The openai client stops reading at `[DONE]` and closes the connection, sometimes before
    the response's last empty message: the request was served in full, not cancelled."""
    clock = ScriptedClock()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
        for text in ("a", "b", "c"):
            clock.advance_ms(5)
            await send({"type": "http.response.body", "body": chat_delta(content=text),
                        "more_body": True})  # fmt: skip
        clock.advance_ms(1)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
        clock.advance_ms(50)
        assert (await receive())["type"] == "http.disconnect"
        if raises:
            raise OSError("the client is gone")

    async def go() -> None:
        messages = [{"type": "http.request", "body": b"{}", "more_body": False},
                    {"type": "http.disconnect"}]  # fmt: skip

        async def receive() -> dict[str, Any]:
            return messages.pop(0)

        async def send(message: dict[str, Any]) -> None:
            pass

        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
                 "headers": [], "state": {}}  # fmt: skip
        middleware = LatencyMiddleware(app, store=store, clock=clock)
        with contextlib.suppress(OSError):
            await middleware(scope, receive, send)

    asyncio.run(go())
    record = only_record(store)
    assert record.outcome == "ok"
    assert (record.output_tokens, len(record.itl_s or [])) == (3, 2)
    assert record.e2e_s == pytest.approx(16 * MS)  # ends at [DONE], not at the disconnect
    assert_additive(record)


@pytest.mark.parametrize("per_message", [1, 2, 5, 40])
def test_each_sse_event_counts_however_the_app_groups_them(
    store: RecordStore, per_message: int
) -> None:
    """A mounted app that sends several SSE events in one body message (sse-starlette
    batching, a generator yielding joined events): each content event is a token event,
    the ones that left together 0 s apart."""
    clock = ScriptedClock()
    events = [chat_delta(role="assistant", content="")]
    events += [chat_delta(content=f" w{index}") for index in range(10)]
    events += [sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})]
    events += [b"data: [DONE]\n\n"]
    groups = [b"".join(events[i : i + per_message]) for i in range(0, len(events), per_message)]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
        for group in groups:
            clock.advance_ms(5)
            await send({"type": "http.response.body", "body": group, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    asyncio.run(call(LatencyMiddleware(app, store=store, clock=clock), clock, {"stream": True}))
    record = only_record(store)
    assert record.output_tokens == 10
    assert record.itl_s is not None and len(record.itl_s) == 9
    assert record.itl_s.count(0.0) == 9 - (len([g for g in groups if b" w" in g]) - 1)
