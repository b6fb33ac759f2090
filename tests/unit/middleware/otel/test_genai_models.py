"""Model names become metric attributes only from the allow-list: hostile names add at most the
`other` series; models the server lists at /v1/models join the list (bounded)."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import httpx
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from middleware import LatencyMiddleware
from middleware.config import MiddlewareConfig
from middleware.otel.models import (
    MAX_LISTED_MODELS,
    ModelLabels,
    provider_for_owner,
    read_listing,
)
from tests.helpers.genai_traffic import MODEL, failing_upstream


def series(app: LatencyMiddleware) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {
        (sample.name, tuple(sorted(sample.labels.items())))
        for family in app.metrics.registry.collect()
        for sample in family.samples
    }


def otel_attribute_sets(reader: InMemoryMetricReader) -> set[tuple[str, frozenset[Any]]]:
    data = reader.get_metrics_data()
    return {
        (metric.name, frozenset(point.attributes.items()))
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
    }


def test_hostile_model_names_add_only_the_other_series() -> None:
    reader = InMemoryMetricReader()
    app = LatencyMiddleware(
        failing_upstream(),
        store=None,
        config=MiddlewareConfig.of(models=[MODEL], metric_readers=[reader]),
    )
    rng = random.Random(24)

    async def ask(count: int, name: Any) -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            for index in range(count):
                route = rng.choice(["/v1/completions", "/v1/chat/completions"])
                body = {"model": name(index), "prompt": "x", "max_tokens": 1}
                await client.post(route, json=body)

    # One request of each kind a hostile client makes anyway: a model nobody listed.
    asyncio.run(ask(2, lambda index: f"probe-{index}"))
    before, before_otel = series(app), otel_attribute_sets(reader)
    asyncio.run(ask(2000, lambda index: f"model-{rng.random()}-{'x' * rng.randrange(300)}"))
    after, after_otel = series(app), otel_attribute_sets(reader)
    app.close()
    assert after == before
    assert {name for name, _ in after_otel} == {name for name, _ in before_otel}
    assert len(after_otel) == len(before_otel)
    models = {dict(labels).get("gen_ai_request_model") for _, labels in after} - {None, ""}
    assert models == {MODEL, "other"}


async def models_listing(scope: Any, receive: Any, send: Any) -> None:
    listing = {"object": "list", "data": [{"id": "qwen-7b", "owned_by": "vllm"},
                                          {"id": "llama-8b", "owned_by": "vllm"}]}  # fmt: skip
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})  # fmt: skip
    await send({"type": "http.response.body", "body": json.dumps(listing).encode()})


def test_listed_models_become_labels() -> None:
    app = LatencyMiddleware(
        models_listing, store=None, config=MiddlewareConfig.of(genai_metrics=False)
    )
    assert app.model_labels.label("qwen-7b") == "other"

    async def list_models() -> dict[str, Any]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return (await client.get("/v1/models")).json()

    answer = asyncio.run(list_models())
    assert [model["id"] for model in answer["data"]] == ["qwen-7b", "llama-8b"]  # untouched
    assert app.model_labels.label("qwen-7b") == "qwen-7b"
    assert app.model_labels.label("llama-8b") == "llama-8b"
    assert app.model_labels.label(None) is None
    app.close()


def test_a_long_listing_is_bounded() -> None:
    labels = ModelLabels(["configured"])
    labels.allow(f"m{index}" for index in range(MAX_LISTED_MODELS * 3))
    assert len(labels.allowed) == 1 + MAX_LISTED_MODELS
    assert labels.label("configured") == "configured"
    assert labels.label(f"m{MAX_LISTED_MODELS * 2}") == "other"


def test_listings_and_owners() -> None:
    assert read_listing(b'{"data": [{"id": "a", "owned_by": "sglang"}, {"id": 3}]}') == (
        ["a"],
        "sglang",
    )
    assert read_listing(b"not json") == ([], None)
    assert read_listing(b'{"data": {"id": "a"}}') == ([], None)
    assert provider_for_owner("vllm") == "vllm"
    assert provider_for_owner("llamacpp") == "llama_cpp"
    assert provider_for_owner("someone") == provider_for_owner(None) == "openai_compatible"


def test_the_proxy_reads_its_upstreams_listing_once() -> None:
    import http.server
    import threading

    from middleware.otel import fetch_listing

    class Listing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"data": [{"id": "qwen-7b", "owned_by": "sglang"}]}'
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Listing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        assert fetch_listing(url) == (["qwen-7b"], "sglang")
    finally:
        server.shutdown()
        server.server_close()
    assert fetch_listing(url, timeout_s=0.5) == ([], None)  # gone: configured labels only
