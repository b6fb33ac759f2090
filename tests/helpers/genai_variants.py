"""The middleware with and without its `gen_ai.*` metrics, as variants of the middleware
workload (tests/helpers/middleware_workload.py): with metrics, records and spans on, and with
tracing off, each without the gen_ai metrics, with the default (on when OpenTelemetry is), and
with them on /metrics alone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from middleware.config import MiddlewareConfig
from tests.helpers.middleware_workload import bare


def middleware(tmp: Path, make_app: Callable[[], Any], *, spans: bool, genai: Any) -> Any:
    """`genai`: False (none), None (the default: on when OpenTelemetry is), or "prometheus"
    (on, for /metrics alone)."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    from middleware import LatencyMiddleware
    from middleware.tracing import DropCounter, counting_batch_processor
    from tests.benchmarks.null_exporter import NullSpanExporter

    provider = None
    if spans:
        provider = TracerProvider()
        provider.add_span_processor(counting_batch_processor(NullSpanExporter(), DropCounter()))
    store = f"sqlite:///{tmp / f'{spans}-{genai}.db'}"
    readers = [InMemoryMetricReader()] if spans and genai is None else []  # an SDK reader
    return LatencyMiddleware(
        make_app(),
        store=store,
        model="m",
        config=MiddlewareConfig.of(
            tracer_provider=provider,
            genai_metrics=True if genai == "prometheus" else genai,
            metric_readers=readers,
        ),
    )


ALL_ON, ALL_ON_GENAI = "all on, no gen_ai metrics", "all on (default: + gen_ai metrics)"
OFF, OFF_DEFAULT = "tracing off, no gen_ai metrics", "tracing off (default)"
OFF_PROMETHEUS = "tracing off + gen_ai on /metrics"
VARIANTS: dict[str, Callable[[Path, Callable[[], Any]], Any]] = {
    "bare": bare,
    ALL_ON: lambda t, m: middleware(t, m, spans=True, genai=False),
    ALL_ON_GENAI: lambda t, m: middleware(t, m, spans=True, genai=None),
    OFF: lambda t, m: middleware(t, m, spans=False, genai=False),
    OFF_DEFAULT: lambda t, m: middleware(t, m, spans=False, genai=None),
    OFF_PROMETHEUS: lambda t, m: middleware(t, m, spans=False, genai="prometheus"),
}
