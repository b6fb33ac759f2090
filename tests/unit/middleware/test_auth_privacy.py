"""API keys, per-key rate limits, opt-in content capture with redaction, bounded labels."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from middleware import LatencyMiddleware, ScriptedClock
from middleware.auth import ApiKeyAuth, load_keys
from middleware.capture import ContentCapture
from middleware.config import MiddlewareConfig
from slo.errors import UsageError
from slo.store import RecordStore
from tests.helpers.api_key_app import KEY, call, echo_app, keys_file


def test_missing_and_wrong_keys_get_the_same_401(tmp_path: Path, store: RecordStore) -> None:
    app = LatencyMiddleware(
        echo_app, store=store, config=MiddlewareConfig.of(auth=keys_file(tmp_path))
    )
    missing = asyncio.run(call(app, {}))
    wrong = asyncio.run(call(app, {"authorization": "Bearer nope"}))
    assert missing[0] == wrong[0] == 401
    assert missing[2] == wrong[2] and b"invalid or missing API key" in missing[2]
    ok = asyncio.run(call(app, {"authorization": f"Bearer {KEY}"}))
    assert ok[0] == 200
    also_ok = asyncio.run(call(app, {"x-api-key": KEY}))
    assert also_ok[0] == 200
    store.flush()
    records = store.query()
    assert sorted(r.outcome for r in records) == ["client_error", "client_error", "ok", "ok"]
    assert {r.tier for r in records if r.outcome == "ok"} == {"premium"}  # the key's tier


def test_requests_per_minute_bucket_gives_429_with_retry_after(
    tmp_path: Path, store: RecordStore
) -> None:
    clock = ScriptedClock()
    app = LatencyMiddleware(
        echo_app,
        store=store,
        clock=clock,
        config=MiddlewareConfig.of(auth=keys_file(tmp_path, requests_per_minute=3)),
    )
    headers = {"authorization": f"Bearer {KEY}"}
    statuses = [asyncio.run(call(app, headers))[0] for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    status, response_headers, body = asyncio.run(call(app, headers))
    assert status == 429 and int(response_headers[b"retry-after"]) >= 1 and b"acme" in body
    clock.advance_ms(20_000)  # a minute refills 3: 20 s refills one
    assert asyncio.run(call(app, headers))[0] == 200
    store.flush()
    assert sum(r.outcome == "rate_limited" for r in store.query()) == 2


def test_tokens_per_minute_are_charged_after_the_request(tmp_path: Path) -> None:
    auth = ApiKeyAuth.load(keys_file(tmp_path, tokens_per_minute=100))
    (key,) = auth.keys.values()
    headers = {"authorization": f"Bearer {KEY}"}
    assert auth.check(headers, 0.0).status is None
    auth.charge_tokens(key, 150, 0.0)  # a big request may overdraw; the next one waits
    refused = auth.check(headers, 1.0)
    assert refused.status == 429 and refused.retry_after_s > 0
    assert auth.check(headers, 60.0).status is None


@pytest.mark.parametrize(
    ("content", "phrase"),
    [
        ("keys: [", "not valid YAML"),
        ("{}", "'keys' list"),
        ('{"keys": [{"sha256": "' + "a" * 64 + '"}]}', "needs an 'id'"),
        ('{"keys": [{"id": "x", "sha256": "short"}]}', "64-hex"),
        ('{"keys": [{"id": "x", "sha256": "' + "a" * 64 + '", "tier": "gold"}]}', "tier 'gold'"),
        (
            '{"keys": [{"id": "x", "sha256": "' + "a" * 64 + '", "requests_per_minute": -1}]}',
            "positive",
        ),
        (
            '{"keys": [{"id": "x", "sha256": "'
            + "a" * 64
            + '"}, {"id": "x", "sha256": "'
            + "b" * 64
            + '"}]}',
            "twice",
        ),
    ],
)
def test_bad_key_files_name_the_place_and_the_fix(
    tmp_path: Path, content: str, phrase: str
) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(content)
    with pytest.raises(UsageError, match=phrase) as caught:
        load_keys(path, {"premium", "standard"})
    assert str(path) in str(caught.value)


def spans_of(capture: ContentCapture | None, body: bytes) -> dict[str, Any]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = LatencyMiddleware(
        echo_app, store=None, config=MiddlewareConfig.of(tracer_provider=provider, capture=capture)
    )
    asyncio.run(call(app, {}, body=body))
    (server,) = [s for s in exporter.get_finished_spans() if s.kind.name == "SERVER"]
    return dict(server.attributes or {})


def test_no_text_in_spans_by_default_and_redacted_when_captured() -> None:
    body = json.dumps(
        {
            "prompt": "mail jane.doe@example.com, key sk-live_abcdefghijklmnop, "
            "card 4111 1111 1111 1111"
        }
    ).encode()
    assert not any(k.startswith(("gen_ai.input", "gen_ai.output")) for k in spans_of(None, body))
    attributes = spans_of(ContentCapture(), body)
    prompt = attributes["gen_ai.input.messages"]
    assert "jane.doe@example.com" not in prompt and "sk-live_abcdefghijklmnop" not in prompt
    assert "4111 1111 1111 1111" not in prompt and "[REDACTED]" in prompt
    assert "[REDACTED]" in attributes["gen_ai.output.messages"]


def test_labels_stay_bounded_under_hostile_input(tmp_path: Path) -> None:
    app = LatencyMiddleware(echo_app, store=None, model="m")
    rng = random.Random(7)

    def series_now() -> set[tuple[str, tuple[tuple[str, str], ...]]]:
        return {
            (sample.name, tuple(sorted(sample.labels.items())))
            for family in app.metrics.registry.collect()
            for sample in family.samples
        }

    # Every child exists from startup (tiers x LLM routes x outcomes): input adds none.
    at_startup = series_now()

    async def hammer() -> None:
        for index in range(10_000):
            path = rng.choice(
                ["/v1/completions", "/v1/chat/completions", f"/v1/{rng.random()}", f"/x{index}"]
            )
            headers = {
                "x-llm-tier": f"tier-{rng.random()}",
                "x-model": f"model-{index}",
                "traceparent": f"junk-{index}",
            }
            await call(app, headers, path=path)

    asyncio.run(hammer())
    series = series_now()
    assert series == at_startup
    tiers = {dict(labels).get("tier") for _, labels in series} - {None}
    assert tiers <= {"premium", "standard", "batch"}
    routes = {dict(labels).get("route") for _, labels in series} - {None}
    assert routes <= app.llm_routes  # the default LLM routes and the spec's batch route
