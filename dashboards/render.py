"""Grafana dashboard JSON and provisioning files from the templates in `dashboards/templates/`.

`panel_queries` reads the PromQL back out of a rendered dashboard, so a test can run every
panel's query against a real Prometheus (no empty panel ships unnoticed).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from dashboards.panels import Panel, Row, rows
from slo.files import write_tree
from slo.sli import CATALOG
from slo.spec import SLOSpec

OVERVIEW_UID = "llm-slo-overview"
DATASOURCE_UID = "llm-slo-prometheus"
SCHEMA_VERSION = 39
_GRID_WIDTH = 24
_PANEL_HEIGHT = 8
# A row's notes: a few paragraphs and a small table of markdown.
_NOTES_HEIGHT = 11
_NOTES_TITLE = "About this row"


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    ref_id: str
    expr: str
    optional: bool  # in a collapsed "when exported" row: may be empty on a CPU-only engine


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("dashboards", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["json"] = lambda value: json.dumps(value, ensure_ascii=False)
    return env


def _render(template: str, **context: Any) -> str:
    return _environment().get_template(template).render(**context)


def _layout(all_rows: list[Row]) -> list[dict[str, Any]]:
    """Grid positions and ids: rows full width, a row's notes full width above its panels,
    panels two per line, collapsed rows nest."""
    items: list[dict[str, Any]] = []
    next_id, y = 1, 0
    for row in all_rows:
        row_item: dict[str, Any] = {"id": next_id, "row": row, "y": y, "panels": []}
        next_id, y = next_id + 1, y + 1
        if row.notes:
            row_item["panels"].append(
                {
                    "id": next_id,
                    "notes": row.notes,
                    "x": 0,
                    "y": y,
                    "w": _GRID_WIDTH,
                    "h": _NOTES_HEIGHT,
                }
            )
            next_id, y = next_id + 1, y + _NOTES_HEIGHT
        x = 0
        for panel in row.panels:
            row_item["panels"].append(
                {
                    "id": next_id,
                    "panel": panel,
                    "x": x,
                    "y": y,
                    "w": panel.width,
                    "h": _PANEL_HEIGHT,
                }
            )
            next_id += 1
            x += panel.width
            if x >= _GRID_WIDTH:
                x, y = 0, y + _PANEL_HEIGHT
        if x:
            y += _PANEL_HEIGHT
        items.append(row_item)
    return items


def _panel_json(item: dict[str, Any]) -> str:
    if "notes" in item:
        content = "\n\n".join(item["notes"])
        return _render("text.json.j2", item=item, title=_NOTES_TITLE, content=content)
    panel: Panel = item["panel"]
    return _render(
        "timeseries.json.j2", item=item, panel=panel, ref_ids=_ref_ids(len(panel.targets))
    )


def _ref_ids(count: int) -> list[str]:
    return [chr(ord("A") + index) for index in range(count)]


def render_dashboard(spec: SLOSpec) -> str:
    """The overview dashboard as pretty JSON, ready for import or provisioning."""
    items = _layout(rows(spec))
    for item in items:
        item["panels_json"] = [_panel_json(panel) for panel in item["panels"]]
    requests = CATALOG["requests"].metric
    text = _render(
        "dashboard.json.j2",
        uid=OVERVIEW_UID,
        title="LLM SLO overview",
        schema_version=SCHEMA_VERSION,
        rows=items,
        label_metric=requests,
        source=spec.source,
    )
    # Parse and re-dump: a template slip becomes an error here, not a broken import.
    return json.dumps(json.loads(text), indent=2, ensure_ascii=False) + "\n"


def render_provisioning(
    dashboards_path: str = "/var/lib/grafana/dashboards/llm-slo",
    prometheus_url: str = "http://localhost:9090",
    scrape_interval: str = "15s",
) -> dict[str, str]:
    """{relative path: text} of Grafana's file provisioning for the datasource and dashboards."""
    return {
        "provisioning/dashboards/llm-slo.yaml": _render(
            "provisioning_dashboards.yaml.j2", path=dashboards_path
        ),
        "provisioning/datasources/llm-slo.yaml": _render(
            "provisioning_datasources.yaml.j2",
            uid=DATASOURCE_UID,
            url=prometheus_url,
            scrape_interval=scrape_interval,
        ),
    }


def write_dashboards(
    spec: SLOSpec, out: Path, prometheus_url: str = "http://localhost:9090"
) -> list[Path]:
    """grafana/<uid>.json and grafana/provisioning/... under `out`."""
    files = {f"grafana/{OVERVIEW_UID}.json": render_dashboard(spec)}
    for relative, text in render_provisioning(prometheus_url=prometheus_url).items():
        files[f"grafana/{relative}"] = text
    return write_tree(out, files)


def panel_queries(dashboard: dict[str, Any] | str) -> list[PanelQuery]:
    """Every target expression of every panel, collapsed rows' panels marked optional."""
    model = json.loads(dashboard) if isinstance(dashboard, str) else dashboard
    found: list[PanelQuery] = []

    def visit(panels: list[dict[str, Any]], optional: bool) -> None:
        for panel in panels:
            if panel.get("type") == "row":
                visit(panel.get("panels", []), optional or bool(panel.get("collapsed")))
                continue
            for target in panel.get("targets", []):
                found.append(PanelQuery(panel["title"], target["refId"], target["expr"], optional))

    visit(model["panels"], False)
    return found


def substitute(expr: str, rate_interval: str = "1m", **variables: str) -> str:
    """Replace Grafana's variables as a browser would with every variable on "All"."""
    expr = expr.replace("$__rate_interval", rate_interval)
    return re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m.group(1), ".*"), expr)
