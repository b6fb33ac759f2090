"""The core's GenAI entries (`slo.genai`) are what the middleware serves on `/metrics`: every
family, every sample name and every label, nothing more. The dashboards read their names
from the core, so this is what keeps their GenAI row on real series without a Prometheus
(tests/integration/test_genai_dashboard.py runs its queries against one).
"""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from middleware import LatencyMiddleware
from middleware.config import MiddlewareConfig
from slo.genai import INSTRUMENTS, Instrument, prometheus_label, prometheus_name
from tests.helpers.genai_traffic import MODEL, failing_upstream, scrape
from tests.helpers.genai_traffic import send_requests as send


def _scraped() -> dict[str, dict[str, set[str]]]:
    """{family: {sample name: label names}} of the gen_ai families on /metrics."""
    app = LatencyMiddleware(
        failing_upstream(),
        store=None,
        model="upstream",
        config=MiddlewareConfig.of(models=[MODEL], genai_metrics=True),
    )
    asyncio.run(send(app))
    text = asyncio.run(scrape(app))
    app.close()
    found: dict[str, dict[str, set[str]]] = {}
    for family in text_string_to_metric_families(text):
        # prometheus_client's creation timestamps parse as families of their own.
        if family.name.startswith("gen_ai_") and not family.name.endswith("_created"):
            samples = found.setdefault(family.name, {})
            for sample in family.samples:
                samples.setdefault(sample.name, set()).update(set(sample.labels) - {"le"})
    return found


def test_metrics_serves_exactly_the_cores_names_and_labels() -> None:
    scraped = _scraped()
    # prometheus_client names a counter's family without `_total`, its sample with it.
    families = {i.prometheus_name.removesuffix("_total") for i in INSTRUMENTS}
    assert set(scraped) == families
    for instrument in INSTRUMENTS:
        samples = scraped[instrument.prometheus_name.removesuffix("_total")]
        assert set(samples) >= set(instrument.prometheus_series), instrument.name
        for name in instrument.prometheus_series:
            assert samples[name] == set(instrument.prometheus_labels), name


def test_prometheus_names_follow_the_translation_rules() -> None:
    assert prometheus_label("gen_ai.operation.name") == "gen_ai_operation_name"
    assert prometheus_label("error.type") == "error_type"
    assert prometheus_name("gen_ai.server.request.duration", "s", "histogram") == (
        "gen_ai_server_request_duration_seconds"
    )
    assert prometheus_name("a.b", "{token}", "histogram") == "a_b"  # annotations are dropped
    assert prometheus_name("a.b", "{token}", "counter") == "a_b_total"
    assert prometheus_name("a.duration_seconds", "s", "histogram") == "a_duration_seconds"
    counter = Instrument("x.y", "counter", "{token}", "", ("gen_ai.token.modality",))
    assert counter.prometheus_series == ("x_y_total",)
    assert counter.prometheus_labels == ("gen_ai_token_modality",)
