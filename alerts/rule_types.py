"""The shapes a rule file is made of, shared by the modules that fill it."""

from __future__ import annotations

from dataclasses import dataclass, field

from slo.sli import CATALOG

GOOD_OUTCOME = "ok"
REQUESTS = CATALOG["requests"].metric
GOOD_REQUESTS = CATALOG["good_requests"].metric


@dataclass(frozen=True)
class Rule:
    """One entry of a rule group, as the template writes it."""

    expr: str
    record: str | None = None
    alert: str | None = None
    for_: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Group:
    name: str
    rules: list[Rule]
    interval: str | None = None


@dataclass(frozen=True)
class Links:
    """Where annotations point: runbook `<runbook_base>/<alertname>.md`, the dashboard."""

    runbook_base: str = "https://runbooks.example.com/llm-slo"
    dashboard: str = "http://localhost:3000/d/llm-slo-overview"
