"""OTLP/HTTP export of the GenAI-convention spans and metrics, configured only by the standard
`OTEL_*` variables, decoded by a real receiver on a loopback port (opentelemetry-proto)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from middleware import LatencyMiddleware
from middleware.config import MiddlewareConfig
from middleware.tracing import DropCounter, provider_from_environment
from tests.helpers.genai_traffic import MODEL, REQUESTS, failing_upstream, send_requests
from tests.helpers.standin_process import OtlpReceiver, otlp_receiver

CONVENTIONS = yaml.safe_load(
    (Path(__file__).parents[1] / "conventions" / "gen_ai_066d4a7f.yaml").read_text()
)
OTLP_SERVER_KIND = 2
CUMULATIVE, DELTA = 2, 1


def export_through(receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    """Our middleware, configured by the environment alone, serves REQUESTS and shuts down."""
    settings = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "llm-slo-otlp-test",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_METRIC_EXPORT_INTERVAL": "60000",  # only the final export, at shutdown
        **env,
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    tracer_provider = provider_from_environment(DropCounter())
    assert tracer_provider is not None
    app = LatencyMiddleware(
        failing_upstream(),
        store=None,
        config=MiddlewareConfig.of(models=[MODEL], tracer_provider=tracer_provider),
    )
    asyncio.run(send_requests(app))
    app.close()  # the meter provider's shutdown exports what is left
    tracer_provider.shutdown()


def wait_for(receiver: OtlpReceiver, what: str, enough: Any) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not enough():
        time.sleep(0.05)
    assert enough(), f"the receiver did not get the {what}"


def test_spans_and_metrics_arrive_by_the_conventions(monkeypatch: pytest.MonkeyPatch) -> None:
    with otlp_receiver() as receiver:
        export_through(receiver, monkeypatch)
        wait_for(receiver, "request spans", lambda: len(receiver.named(str.strip)) >= 3 * 2)
        wait_for(receiver, "metrics", lambda: bool(receiver.points))
    servers = [span for span in receiver.spans if span.kind == OTLP_SERVER_KIND]
    assert sorted(span.name for span in servers) == sorted(
        f"{'chat' if 'chat' in route else 'text_completion'} {MODEL}" for route, *_ in REQUESTS
    )
    for span in servers:
        assert span.attributes["gen_ai.provider.name"]
        assert span.attributes["gen_ai.request.model"] == MODEL
        assert span.resource["service.name"] == "llm-slo-otlp-test"
    (failed,) = [span for span in servers if "error.type" in span.attributes]
    assert failed.attributes["error.type"] == "server_error"

    by_name: dict[str, list[Any]] = {}
    for point in receiver.points:
        by_name.setdefault(point.metric, []).append(point)
    assert set(CONVENTIONS["metrics"]) <= set(by_name)
    for name, entry in CONVENTIONS["metrics"].items():
        points = by_name[name]
        assert {p.unit for p in points} == {entry["unit"]}
        assert {p.temporality for p in points} == {CUMULATIVE}
        assert {p.scope_schema_url for p in points} == {CONVENTIONS["source"]["schema_url"]}
        if entry["instrument"] == "histogram":
            assert {p.explicit_bounds for p in points} == {tuple(entry["boundaries"])}
        for point in points:
            assert set(point.attributes) <= set(entry["attributes"])
            assert point.resource["service.instance.id"]  # workers' series stay apart
    durations = by_name["gen_ai.server.request.duration"]
    assert sum(p.count for p in durations) == len(REQUESTS)


def test_delta_temporality_as_the_exporter_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    with otlp_receiver() as receiver:
        export_through(
            receiver, monkeypatch, OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE="delta"
        )
        wait_for(receiver, "metrics", lambda: bool(receiver.points))
    durations = [p for p in receiver.points if p.metric == "gen_ai.server.request.duration"]
    assert {p.temporality for p in durations} == {DELTA}
    assert sum(p.count for p in durations) == len(REQUESTS)
    tokens = [
        p for p in receiver.points if p.metric == "gen_ai.client.inference.usage.output_tokens"
    ]
    sent = sum(body["max_tokens"] for _, body, _, failed in REQUESTS if not failed)
    assert sum(p.total for p in tokens) == sent
