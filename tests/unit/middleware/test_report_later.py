"""Reports that wait a moment (`middleware.request.later`, `slo proxy`'s default): the request is
reported by itself once the delay is over, and whatever reads the reports sooner (`/metrics`,
`/slo`, `requests_seen`, `close`) runs the waiting ones first, so every reader still counts the
request that just ended. With no delay nothing waits."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from middleware import LatencyMiddleware, ScriptedClock
from middleware.config import MiddlewareConfig
from middleware.request.later import Later
from slo.store import RecordStore
from tests.helpers.scripted_stream import call, vllm_style_app

DELAY_S = 0.05


def test_later_runs_each_report_once_after_the_delay_or_when_asked() -> None:
    ran: list[int] = []

    async def scenario() -> None:
        later = Later(DELAY_S)
        later.put(lambda: ran.append(1))
        later.put(lambda: ran.append(2))
        assert (ran, later.waiting) == ([], 2)  # nothing runs on the caller's turn
        await asyncio.sleep(DELAY_S * 3)
        assert (ran, later.waiting) == ([1, 2], 0)  # one timer ran both, oldest first
        later.put(lambda: ran.append(3))
        later.run_now()
        later.run_now()
        assert ran == [1, 2, 3]
        await asyncio.sleep(DELAY_S * 3)  # the timer finds nothing left
        assert ran == [1, 2, 3]

    asyncio.run(scenario())


def test_later_without_a_delay_or_a_loop_runs_at_once() -> None:
    ran: list[str] = []
    Later(0).put(lambda: ran.append("no delay"))
    Later(DELAY_S).put(lambda: ran.append("no running loop"))
    assert ran == ["no delay", "no running loop"]
    with pytest.raises(ValueError, match="report delay -1"):
        Later(-1)


async def get(app: LatencyMiddleware, path: str) -> bytes:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "headers": [], "query_string": b""}
    await app(scope, receive, send)
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def requests_counted(metrics_text: bytes) -> float:
    total = 0.0
    for line in metrics_text.decode().splitlines():
        if line.startswith("llm_slo_requests_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("reader", ["/metrics", "/slo", "requests_seen"])
def test_a_reader_counts_the_request_that_just_ended(store: RecordStore, reader: str) -> None:
    clock = ScriptedClock()
    app = LatencyMiddleware(
        vllm_style_app(clock, []),
        store=store,
        clock=clock,
        config=MiddlewareConfig.of(report_delay_s=60.0),
    )

    async def scenario() -> None:
        await call(app, clock, {"messages": [], "stream": True})
        assert app.reporter.requests_seen == 0  # the report waits (a minute, here)
        if reader == "/metrics":
            assert requests_counted(await get(app, "/metrics")) == 1
        elif reader == "/slo":
            live = json.loads(await get(app, "/slo"))
            assert sum(tier["requests"] for tier in live["tiers"]) == 1, live
        else:
            assert app.requests_seen == 1

    asyncio.run(scenario())
    app.close()
    store.flush()
    assert len(store.query()) == 1


def test_a_waiting_report_goes_out_by_itself_and_at_close(store: RecordStore) -> None:
    clock = ScriptedClock()
    app = LatencyMiddleware(
        vllm_style_app(clock, []),
        store=store,
        clock=clock,
        config=MiddlewareConfig.of(report_delay_s=DELAY_S),
    )

    async def scenario() -> None:
        await call(app, clock, {"messages": [], "stream": True})
        assert app.reporter.requests_seen == 0
        await asyncio.sleep(DELAY_S * 3)
        assert app.reporter.requests_seen == 1  # the timer reported it, nobody asked
        await call(app, clock, {"messages": [], "stream": True})  # then left waiting

    asyncio.run(scenario())
    assert app.reporter.requests_seen == 1
    app.close()  # the waiting report is made before the store closes: no record lost
    assert app.reporter.requests_seen == 2
    store.flush()
    assert len(store.query()) == 2
