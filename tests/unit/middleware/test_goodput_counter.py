"""The good-requests counter: what the middleware counts as good is what `slo check` judges
good on the records it writes, and what `/slo` counts, request by request.

One tier, a strict TTFT objective, an e2e objective and goodput; through the middleware, on a
scripted clock, requests of every kind a goodput decision meets: fast, a TTFT over the
threshold, a TTFT exactly on a strict threshold (the histogram's `le` bucket holds it, the
per-request decision does not), an ok answer that produced no tokens fast and one slow (its
record keeps e2e, not TTFT), a slow end, a server error and a client error (not counted).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from middleware import LatencyMiddleware, ScriptedClock
from middleware.config import MiddlewareConfig
from slo.check.evaluate import evaluate
from slo.sli import CATALOG, OUTCOMES, OUTCOMES_EXCLUDED_FROM_AVAILABILITY
from slo.spec import SLOSpec
from slo.store import RecordStore
from tests.helpers.scripted_stream import call, chat_delta
from tests.helpers.tier_specs import make_tier, spec_yaml

SPEC = SLOSpec.from_yaml(
    spec_yaml(
        make_tier(
            "premium",
            "p95 ttft < 100ms",
            "p99 e2e <= 500ms",
            "goodput >= 50%",
            priority=0,
            default=True,
        ),
    )
)


# Per request: status, milliseconds to the first token (after the 2 ms body), tokens, then
# milliseconds to the end; whether it is good, and whether goodput counts it at all.
def _ask(status: int, first_ms: float, tokens: int, tail_ms: float = 0) -> dict[str, Any]:
    return {"status": status, "first_ms": first_ms, "tokens": tokens, "tail_ms": tail_ms}


REQUESTS: list[tuple[str, dict[str, Any], bool, bool]] = [
    ("fast", _ask(200, 40, 4, 30), True, True),
    ("slow first token", _ask(200, 148, 4, 30), False, True),
    ("first token on a strict threshold", _ask(200, 98, 4, 30), False, True),
    ("ok, no tokens, fast", _ask(200, 18, 0), True, True),
    ("ok, no tokens, slow", _ask(200, 598, 0), False, True),
    ("slow end", _ask(200, 40, 4, 600), False, True),
    ("server error", _ask(500, 5, 0), False, True),
    ("client error", _ask(400, 5, 0), False, False),
]


def scripted_engine(clock: ScriptedClock) -> Any:
    """Streams `tokens` one per chunk after `first_ms`, each gap `tail_ms / tokens`; a plain
    body with usage when it produces none, or an error status."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        ask = json.loads((await receive())["body"])["script"]
        status, tokens = ask["status"], ask["tokens"]
        clock.advance_ms(ask["first_ms"])
        if status != 200 or not tokens:
            body = {"choices": [{"message": {"content": ""}}]} if status == 200 else {}
            body["usage"] = {"prompt_tokens": 3, "completion_tokens": 0}
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": json.dumps(body).encode()})
            return
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for index in range(tokens):
            if index:
                clock.advance_ms(ask["tail_ms"] / (tokens - 1))
            chunk = chat_delta(content=f" t{index}")
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    return app


def test_the_counter_the_records_and_slo_count_the_same_good_requests(
    store: RecordStore,
) -> None:
    clock = ScriptedClock()
    registry = CollectorRegistry()
    app = LatencyMiddleware(
        scripted_engine(clock),
        spec=SPEC,
        store=store,
        model="m",
        clock=clock,
        config=MiddlewareConfig.of(registry=registry),
    )
    try:
        for _, script, _, _ in REQUESTS:
            body = {"model": "m", "messages": [], "stream": True, "script": script}
            asyncio.run(call(app, clock, body))
        good = sum(is_good for *_, is_good, _ in REQUESTS)
        events = sum(counted for *_, counted in REQUESTS)
        assert (good, events) == (2, 7)

        store.flush()
        records = store.query()
        by_name = dict(zip((name for name, *_ in REQUESTS), records, strict=True))
        assert by_name["first token on a strict threshold"].ttft_s == 0.1
        assert by_name["ok, no tokens, fast"].ttft_s is None
        assert by_name["ok, no tokens, fast"].e2e_s == pytest.approx(0.02)
        (judged,) = [
            r for r in evaluate(SPEC, records).tiers[0].objectives if r.objective.kind == "goodput"
        ]
        assert (judged.good, judged.events) == (good, events)

        app.metrics.flush()
        labels = {"tier": "premium", "model": "m", "route": "/v1/chat/completions"}
        counted = sum(
            registry.get_sample_value(CATALOG["requests"].metric, {**labels, "outcome": o}) or 0
            for o in OUTCOMES
            if o not in OUTCOMES_EXCLUDED_FROM_AVAILABILITY
        )
        exported = registry.get_sample_value(CATALOG["good_requests"].metric, labels)
        assert (exported, counted) == (good, events)

        (live,) = [o for o in app.live.status()["tiers"][0]["objectives"] if o["kind"] == "goodput"]
        assert (live["good"], live["events"]) == (good, events)
    finally:
        app.close()
