"""The panels of the generated dashboard, as data: titles, units and PromQL from the catalog,
one module per family of rows.

`dashboards.service_rows`: SLOs, latency, traffic; `dashboards.engine_rows`: the engine, tier
isolation, GPUs and engine features; `dashboards.genai_row`: the OpenTelemetry GenAI series.
The PromQL they share is in `dashboards.queries`, the data model in `dashboards.model`.
"""

from __future__ import annotations

from dashboards.engine_rows import engine_row, optional_row, tier_isolation_row
from dashboards.genai_row import genai_row
from dashboards.model import Panel, Row, Target
from dashboards.queries import QUANTILES, RATE, mean_expr, quantile_expr
from dashboards.service_rows import LATENCY_PANELS, latency_row, slo_row, traffic_row
from slo.spec import SLOSpec

__all__ = [
    "LATENCY_PANELS",
    "QUANTILES",
    "RATE",
    "Panel",
    "Row",
    "Target",
    "mean_expr",
    "quantile_expr",
    "rows",
]


def rows(spec: SLOSpec) -> list[Row]:
    return [
        slo_row(spec),
        latency_row(spec),
        traffic_row(),
        engine_row(),
        tier_isolation_row(),
        optional_row(),
        genai_row(),
    ]
