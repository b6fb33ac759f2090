"""An https:// upstream with a private CA: besides the proxied requests, `slo proxy` reads the
engine's /v1/models (model labels, provider) and its /metrics (engine gauges) over the same
TLS context, and an unverifiable certificate reads nothing."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from middleware.otel import fetch_listing
from middleware.upstream.engine_metrics import EngineMetricsScraper
from slo.cli.bench.server import free_port
from tests.helpers.tls import Pki, wait_until_https_ready

pytestmark = pytest.mark.integration

METRICS = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m1"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m1"} 2.0
"""


async def models(request: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [{"id": "m1", "owned_by": "vllm"}]})


async def metrics(request: Request) -> PlainTextResponse:
    return PlainTextResponse(METRICS)


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


@contextlib.contextmanager
def https_engine(pki: Pki) -> Iterator[str]:
    import uvicorn

    app = Starlette(
        routes=[Route("/v1/models", models), Route("/metrics", metrics), Route("/health", health)]
    )
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        ssl_certfile=str(pki.server_cert),
        ssl_keyfile=str(pki.server_key),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"https://127.0.0.1:{port}"
    try:
        wait_until_https_ready(url + "/health", pki.client_context())
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_models_listing_uses_the_upstream_tls_context(pki: Pki) -> None:
    with https_engine(pki) as url:
        assert fetch_listing(url, context=pki.client_context()) == (["m1"], "vllm")
        assert fetch_listing(url) == ([], None)  # the system's CAs do not know the test's CA


def readings(pki: Pki, url: str, verify: object) -> list[Mapping[str, float]]:
    got: list[Mapping[str, float]] = []
    scraper = EngineMetricsScraper(
        url + "/metrics", lambda gauges, _preempted: got.append(dict(gauges)),
        interval_s=0.2, verify=verify,  # type: ignore[arg-type]
    )  # fmt: skip
    scraper.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(got):
            time.sleep(0.05)
    finally:
        scraper.stop()
    return got


def test_engine_metrics_are_read_over_the_upstream_tls_context(pki: Pki, tmp_path: Path) -> None:
    with https_engine(pki) as url:
        verified = readings(pki, url, pki.client_context())
        assert any(reading.get("running") == 3.0 for reading in verified), verified
        unverified = readings(pki, url, True)
        assert not any(reading.get("running") for reading in unverified), unverified
