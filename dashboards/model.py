"""The dashboard as data: rows of panels, each panel a title, a unit and PromQL targets.

The row modules build these; `dashboards.render` lays them out and renders them to Grafana's
JSON model through the templates.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    unit: str
    targets: list[Target]
    stacked: bool = False
    width: int = 12


@dataclass(frozen=True)
class Row:
    title: str
    panels: list[Panel]
    # A collapsed row holds panels whose metrics only some deployments export (GPUs, prefix
    # cache, speculative decoding): they may be empty without anything being wrong.
    optional: bool = False
    # Markdown shown in a text panel at the top of the row: Grafana's row header has no
    # description of its own, and a row whose series need a word of explanation gets one here.
    notes: list[str] = field(default_factory=list)
