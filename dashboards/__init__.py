"""Grafana dashboards for an SLO spec, from Jinja2 templates in `dashboards/templates/`.

Metric names come from the SLI catalog, recording-rule names from `slo.promql`.
"""

from dashboards.render import (
    DATASOURCE_UID,
    OVERVIEW_UID,
    PanelQuery,
    panel_queries,
    render_dashboard,
    render_provisioning,
    substitute,
    write_dashboards,
)

__all__ = [
    "DATASOURCE_UID",
    "OVERVIEW_UID",
    "PanelQuery",
    "panel_queries",
    "render_dashboard",
    "render_provisioning",
    "substitute",
    "write_dashboards",
]
