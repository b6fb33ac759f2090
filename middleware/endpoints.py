"""The middleware's own endpoints: `/metrics` (Prometheus exposition, OpenMetrics when asked)
and `/slo` / `/slo.html` (the live SLOs, as JSON or as the on-call page)."""

from __future__ import annotations

from typing import Any

from middleware.live import LiveSLO
from middleware.live.page import respond as slo_page_answer
from middleware.metrics.metric_set import MetricSet
from middleware.types import Scope, Send


async def serve_metrics(metrics: MetricSet, scope: Scope, send: Send) -> None:
    accept = ""
    for key, value in scope.get("headers", ()):
        if key.lower() == b"accept":
            accept = value.decode("latin-1")
    body, content_type = metrics.exposition(accept)
    await _answer(send, 200, content_type, body)


async def serve_slo(
    live: LiveSLO, metrics: MetricSet, as_html: bool, scope: Scope, send: Send
) -> None:
    query = scope.get("query_string", b"").decode("latin-1")
    code, content_type, body = slo_page_answer(live, as_html, query, metrics)
    await _answer(send, code, content_type, body)


async def _answer(send: Send, status: int, content_type: str, body: Any) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type.encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
