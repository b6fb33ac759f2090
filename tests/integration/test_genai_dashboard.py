"""The dashboard's OpenTelemetry GenAI row against a real Prometheus scraping the middleware
with its gen_ai.* metrics on: every query of the row returns data, split by exactly the
labels it groups by, with the operations and the model the traffic had.

The row's names come from `slo.genai`, and so do the middleware's: this checks that what the
dashboard asks for is what `/metrics` serves.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import httpx
import pytest

from dashboards import PanelQuery, panel_queries, render_dashboard, substitute
from dashboards.genai_row import GROUP
from middleware import LatencyMiddleware
from middleware.config import MiddlewareConfig
from middleware.otel.conventions import CHAT, TEXT_COMPLETION
from slo.genai import OPERATION, REQUEST_MODEL, prometheus_label
from slo.spec import SLOSpec
from tests.helpers.genai_traffic import MODEL, REQUESTS, failing_upstream
from tests.helpers.polling import wait_until
from tests.helpers.prometheus_process import prometheus, query
from tests.helpers.servers import uvicorn_thread

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

RATE_INTERVAL = "15s"  # Grafana's $__rate_interval for a 1s scrape interval, with margin


def _send(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=30) as client:
        for route, body, headers, _ in REQUESTS:
            client.post(route, json=body, headers=headers)


def _measured(prom: str, panel_query: PanelQuery) -> list[dict[str, Any]]:
    """The series with a value: the ok series of every listed model are born at 0, so a
    quantile over them is NaN and a rate 0 until traffic comes."""
    series = query(prom, substitute(panel_query.expr, RATE_INTERVAL))
    return [s for s in series if not math.isnan(value := float(s["value"][1])) and value > 0]


def test_every_genai_panel_has_data_split_by_its_labels(tmp_path: Path) -> None:
    queries = [q for q in panel_queries(render_dashboard(SLOSpec.default())) if "gen_ai_" in q.expr]
    assert len(queries) == 3 * 3 + 2  # three percentiles of three histograms, two token rates
    app = LatencyMiddleware(
        failing_upstream(),
        store=None,
        model="upstream",
        config=MiddlewareConfig.of(models=[MODEL], genai_metrics=True),
    )
    with (
        uvicorn_thread(app) as base_url,
        prometheus(tmp_path, [base_url.removeprefix("http://")]) as prom,
    ):

        def every_query_has_data() -> bool:
            _send(base_url)
            return all(_measured(prom, q) for q in queries)

        wait_until(every_query_has_data, 90, "data in every GenAI panel", interval_s=1.0)
        operation, model = prometheus_label(OPERATION), prometheus_label(REQUEST_MODEL)
        for panel_query in queries:
            series = _measured(prom, panel_query)
            assert all(set(s["metric"]) == set(GROUP) for s in series), panel_query
            assert {s["metric"][model] for s in series} == {MODEL}, panel_query
            assert {s["metric"][operation] for s in series} == {CHAT, TEXT_COMPLETION}
    app.close()
