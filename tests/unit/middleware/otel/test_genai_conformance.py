"""What the middleware emits, checked against the GenAI semantic conventions: the copy of their
entries in tests/conventions/ (with the commit they came from), never against our own module.

One ok stream, one ok plain answer and one server error go through the middleware; the request
spans (InMemorySpanExporter), the SDK metrics (InMemoryMetricReader) and a scrape of /metrics
must carry the conventions' names, units, bucket boundaries, and every required and
conditionally required attribute where its condition holds.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from opentelemetry.sdk.metrics.export import Histogram, InMemoryMetricReader, Sum
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from middleware import LatencyMiddleware
from middleware.config import MiddlewareConfig
from tests.helpers.genai_traffic import MODEL, REQUESTS, SERVER, failing_upstream, scrape
from tests.helpers.genai_traffic import send_requests as send

CONVENTIONS = yaml.safe_load(
    (Path(__file__).parents[3] / "conventions" / "gen_ai_066d4a7f.yaml").read_text()
)
SPAN = CONVENTIONS["span"]
METRICS: dict[str, dict[str, Any]] = CONVENTIONS["metrics"]
TYPES = {"string": str, "int": int, "double": float, "bool": bool}


def translated(name: str, unit: str, instrument: str) -> str:
    """The OpenTelemetry specification's Prometheus name: `.` to `_`, the unit as a suffix
    (annotations in braces dropped, `s` is `seconds`), `_total` for counters."""
    base = re.sub(r"[^a-zA-Z0-9_]", "_", name)
    unit = {"s": "seconds"}.get(re.sub(r"\{[^}]*\}", "", unit), "")
    base += f"_{unit}" if unit else ""
    return base + ("_total" if instrument == "counter" else "")


@pytest.fixture(scope="module")
def emitted() -> dict[str, Any]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    app = LatencyMiddleware(
        failing_upstream(),
        store=None,
        model="upstream",
        config=MiddlewareConfig.of(
            models=[MODEL],
            tracer_provider=tracer_provider,
            metric_readers=[reader],
            provider_name="vllm",
        ),
    )
    answers = asyncio.run(send(app))
    assert [a.status_code for a in answers] == [500 if failed else 200 for *_, failed in REQUESTS]
    servers = [s for s in spans.get_finished_spans() if s.kind.name == "SERVER"]
    metrics = {
        metric.name: metric
        for resource in reader.get_metrics_data().resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    text = asyncio.run(scrape(app))
    app.close()
    return {"spans": servers, "metrics": metrics, "scrape": text}


def check_type(key: str, value: Any, kind: str) -> None:
    if kind == "string[]":
        assert isinstance(value, tuple) and all(isinstance(v, str) for v in value), key
    elif kind != "any":
        assert type(value) is TYPES[kind], f"{key}: {value!r} is not {kind}"


@pytest.mark.parametrize("index", range(len(REQUESTS)))
def test_request_span_by_the_conventions(emitted: dict[str, Any], index: int) -> None:
    route, body, _, failed = REQUESTS[index]
    span = emitted["spans"][index]
    attributes = dict(span.attributes)
    assert (
        span.name == f"{attributes['gen_ai.operation.name']} {attributes['gen_ai.request.model']}"
    )
    assert attributes["gen_ai.operation.name"] == ("chat" if "chat" in route else "text_completion")
    expected = SPAN["attributes"]
    for key, entry in expected.items():
        if entry["requirement"] == "required":
            assert key in attributes, f"required {key} missing"
        if key in attributes:
            check_type(key, attributes[key], entry["type"])
    # Conditionally required, each where its condition holds (and only there where it says so).
    assert attributes["gen_ai.request.model"] == body["model"]
    assert ("error.type" in attributes) == failed
    assert "server.address" in attributes and "server.port" in attributes
    assert (attributes["server.address"], attributes["server.port"]) == SERVER
    assert attributes.get("gen_ai.request.stream", False) == bool(body.get("stream"))
    assert attributes.get("gen_ai.request.choice.count") == body.get("n")
    assert attributes.get("gen_ai.request.seed") == body.get("seed")
    # Recommended ones we have: as asked, and as answered.
    assert attributes["gen_ai.request.max_tokens"] == body["max_tokens"]
    assert attributes.get("gen_ai.request.temperature") == body.get("temperature")
    assert attributes.get("gen_ai.request.top_p") == body.get("top_p")
    if not failed:
        assert attributes["gen_ai.response.model"] == MODEL
        assert attributes["gen_ai.response.id"] == "cmpl-test"
        assert attributes["gen_ai.response.finish_reasons"] == ("length",)
        assert attributes["gen_ai.usage.output_tokens"] == body["max_tokens"]
    # No invented or deprecated gen_ai names.
    assert {k for k in attributes if k.startswith("gen_ai.")} <= set(expected)
    assert not set(SPAN["deprecated"]) & set(attributes)


@pytest.mark.parametrize("name", list(METRICS))
def test_sdk_metric_by_the_conventions(emitted: dict[str, Any], name: str) -> None:
    entry = METRICS[name]
    metric = emitted["metrics"][name]
    assert metric.unit == entry["unit"]
    points = list(metric.data.data_points)
    if entry["instrument"] == "histogram":
        assert isinstance(metric.data, Histogram)
        assert all(list(p.explicit_bounds) == entry["boundaries"] for p in points)
    else:
        assert isinstance(metric.data, Sum) and metric.data.is_monotonic
    allowed = set(entry["attributes"])
    required = {k for k, level in entry["attributes"].items() if level == "required"}
    counted = [p for p in points if (p.count if hasattr(p, "count") else p.value)]
    assert counted, f"{name}: nothing recorded"
    for point in points:
        assert set(point.attributes) <= allowed, set(point.attributes) - allowed
        assert required <= set(point.attributes)
    for point in counted:  # every request named a model: its points carry it
        assert point.attributes["gen_ai.request.model"] == MODEL
    failures = [p for p in points if "error.type" in p.attributes]
    if "error.type" in allowed:
        assert [(p.attributes["error.type"], p.count) for p in failures] == [("server_error", 1)]
    else:
        assert failures == []
    if entry.get("successful_only"):
        assert sum(p.count for p in points) == sum(not failed for *_, failed in REQUESTS)


@pytest.mark.parametrize("name", list(METRICS))
def test_prometheus_names_and_buckets_by_the_conventions(
    emitted: dict[str, Any], name: str
) -> None:
    entry = METRICS[name]
    family_name = translated(name, entry["unit"], entry["instrument"])
    samples = [
        sample
        for family in text_string_to_metric_families(emitted["scrape"])
        for sample in family.samples
        if sample.name.startswith(family_name.removesuffix("_total"))
    ]
    assert samples, f"{family_name} is not on /metrics"
    labels = {re.sub(r"[^a-zA-Z0-9_]", "_", key) for key in entry["attributes"]}
    for sample in samples:
        assert set(sample.labels) - {"le"} <= labels
    if entry["instrument"] == "histogram":
        bounds = {float(s.labels["le"]) for s in samples if s.name == family_name + "_bucket"}
        assert bounds == {*entry["boundaries"], float("inf")}
        count = sum(s.value for s in samples if s.name == family_name + "_count")
        otel = sum(p.count for p in emitted["metrics"][name].data.data_points)
    else:
        count = sum(s.value for s in samples if s.name == family_name)
        otel = sum(p.value for p in emitted["metrics"][name].data.data_points)
    assert count == otel > 0  # the same values both ways
