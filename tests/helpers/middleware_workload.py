"""The in-process workload of the middleware benchmarks: two apps (FastAPI, and a plain Starlette
app, where the peers are cheapest: no FastAPI routing to hide behind), each serving a plain JSON
response with usage and a 32-token OpenAI chat stream (role chunk, 32 content chunks, finish
chunk, `[DONE]`); the variants that wrap an app (the bare app, ours in three settings, and the
peers with their defaults); and a driver that sends requests straight through the ASGI callable
(no sockets), so a variant's difference to the bare app is the middleware's own cost.

The peers are imported by the variants that build them: opentelemetry-instrumentation-asgi,
starlette-exporter and prometheus-fastapi-instrumentator need only be installed where those run.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from middleware.config import MiddlewareConfig

REQUESTS_PER_ROUND = 300
CHUNKS = 32


async def complete(request: Request) -> JSONResponse:
    await request.body()
    return JSONResponse({"choices": [{"text": "hello"}], "usage": {"completion_tokens": 1}})


def _chat_chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


STREAM = [
    _chat_chunk({"role": "assistant", "content": ""}),
    *(_chat_chunk({"content": f" t{index}"}) for index in range(CHUNKS)),
    _chat_chunk({}, "length"),
    b"data: [DONE]\n\n",
]


async def _chunks() -> Any:
    for chunk in STREAM:
        yield chunk


async def stream(request: Request) -> StreamingResponse:
    await request.body()
    return StreamingResponse(_chunks(), media_type="text/event-stream")


def make_fastapi() -> Any:
    app = FastAPI()
    app.add_api_route("/v1/completions", complete, methods=["POST"])
    app.add_api_route("/v1/chat/completions", stream, methods=["POST"])
    return app


def make_starlette() -> Any:
    return Starlette(
        routes=[
            Route("/v1/completions", complete, methods=["POST"]),
            Route("/v1/chat/completions", stream, methods=["POST"]),
        ]
    )


FRAMEWORKS = {"fastapi": make_fastapi, "starlette": make_starlette}


def bare(tmp: Path, make_app: Callable[[], Any]) -> Any:
    return make_app()


def ours_all_on(tmp: Path, make_app: Callable[[], Any]) -> Any:
    from opentelemetry.sdk.trace import TracerProvider

    from middleware import LatencyMiddleware
    from middleware.tracing import DropCounter, counting_batch_processor
    from tests.benchmarks.null_exporter import NullSpanExporter

    provider = TracerProvider()
    provider.add_span_processor(counting_batch_processor(NullSpanExporter(), DropCounter()))
    return LatencyMiddleware(
        make_app(),
        store=f"sqlite:///{tmp / 'ours.db'}",
        model="m",
        config=MiddlewareConfig.of(tracer_provider=provider),
    )


def ours_tracing_off(tmp: Path, make_app: Callable[[], Any]) -> Any:
    from middleware import LatencyMiddleware

    return LatencyMiddleware(make_app(), store=f"sqlite:///{tmp / 'ours-off.db'}", model="m")


def ours_metrics_only(tmp: Path, make_app: Callable[[], Any]) -> Any:
    from middleware import LatencyMiddleware

    return LatencyMiddleware(make_app(), store=None, model="m")


def otel_asgi_defaults(tmp: Path, make_app: Callable[[], Any]) -> Any:
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from tests.benchmarks.null_exporter import NullSpanExporter

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(NullSpanExporter()))
    return OpenTelemetryMiddleware(make_app(), tracer_provider=provider)


def starlette_exporter(tmp: Path, make_app: Callable[[], Any]) -> Any:
    from starlette_exporter import PrometheusMiddleware

    app = make_app()
    # It registers in the global registry: a unique prefix per app avoids duplicate names.
    app.add_middleware(PrometheusMiddleware, app_name="bench", prefix=f"bench_{id(app)}")
    return app


def fastapi_instrumentator(tmp: Path, make_app: Callable[[], Any]) -> Any:
    from prometheus_client import CollectorRegistry
    from prometheus_fastapi_instrumentator import Instrumentator

    app = make_app()
    Instrumentator(registry=CollectorRegistry()).instrument(app)
    return app


VARIANTS: dict[str, Callable[[Path, Callable[[], Any]], Any]] = {
    "bare": bare,
    "llm-slo (metrics+records+spans)": ours_all_on,
    "llm-slo (tracing off)": ours_tracing_off,
    "llm-slo (tracing and records off)": ours_metrics_only,
    "opentelemetry-instrumentation-asgi": otel_asgi_defaults,
    "starlette-exporter": starlette_exporter,
    "prometheus-fastapi-instrumentator": fastapi_instrumentator,
}


async def drive(app: Any, path: str, count: int) -> None:
    body = json.dumps({"model": "m", "prompt": "hi"}).encode()
    scope_base = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 5000),
        "headers": [
            (b"host", b"127.0.0.1:8000"),
            (b"content-type", b"application/json"),
            (b"x-llm-tier", b"premium"),
        ],
    }
    for _ in range(count):
        received = False
        finished = asyncio.Event()

        async def receive(finished: asyncio.Event = finished) -> dict[str, Any]:
            nonlocal received
            if not received:
                received = True
                return {"type": "http.request", "body": body, "more_body": False}
            await finished.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any], finished: asyncio.Event = finished) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                finished.set()

        await app({**scope_base, "state": {}}, receive, send)


def run_requests(app: Any, path: str) -> None:
    asyncio.run(drive(app, path, REQUESTS_PER_ROUND))
