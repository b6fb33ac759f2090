"""A request no engine span can find skips the span join: reported at once, even where every
other report waits for its span (engine_spans="always"); one that an engine span can find
still waits. No span can find a request without a trace id or a request id the engine was
sent, nor any request where no span reaches the process (no /v1/traces intake, no relay)."""

from __future__ import annotations

import asyncio

import pytest

from middleware import LatencyMiddleware, ScriptedClock
from middleware.config import MiddlewareConfig
from slo.store import RecordStore
from tests.helpers.scripted_stream import TRACEPARENT, call, vllm_style_app

REQUEST_ID = [(b"x-request-id", b"client-7")]


def reported(
    app: LatencyMiddleware,
    clock: ScriptedClock,
    store: RecordStore,
    headers: list[tuple[bytes, bytes]],
) -> int:
    """Records written at once after one streamed request with these headers."""
    asyncio.run(call(app, clock, {"messages": [], "stream": True}, headers))
    store.flush()
    return len(store.query())


@pytest.mark.parametrize(
    ("headers", "traces_path", "written_at_once"),
    [
        ([], "/v1/traces", 1),  # no key an engine span could carry
        (TRACEPARENT, "/v1/traces", 0),  # its trace id: waits for the span
        (REQUEST_ID, "/v1/traces", 0),  # the request id the engine was sent: waits
        (TRACEPARENT + REQUEST_ID, None, 1),  # no intake: no span can come
    ],
)
def test_only_a_request_a_span_can_find_waits(
    store: RecordStore,
    headers: list[tuple[bytes, bytes]],
    traces_path: str | None,
    written_at_once: int,
) -> None:
    clock = ScriptedClock()
    app = LatencyMiddleware(
        vllm_style_app(clock, []),
        store=store,
        clock=clock,
        config=MiddlewareConfig.of(expect="always", traces_path=traces_path),
    )
    assert reported(app, clock, store, headers) == written_at_once
    counts = app.span_join.counts
    assert app.span_join.waiting == 1 - written_at_once
    app.close()  # a waiting report goes out without its span
    store.flush()
    assert len(store.query()) == 1
    assert counts.waited_in_vain == 1 - written_at_once
