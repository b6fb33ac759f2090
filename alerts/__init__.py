"""Prometheus rules with their promtool tests, Alertmanager configuration and runbooks.

Everything is rendered from Jinja2 templates in `alerts/templates/` for one SLO spec; metric
names come from the SLI catalog and alert semantics from `slo.alert_rules`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alerts.alertmanager import DEFAULT_WEBHOOK_URL, Timing, render_alertmanager, routes
from alerts.anomaly_tests import render_anomaly_test
from alerts.promtool_tests import render_rules_test
from alerts.rules import Links, render_rules
from alerts.runbooks import render_runbooks
from slo.files import write_tree
from slo.spec import SLOSpec

RULES_FILE = "prometheus/rules.yml"
RULES_TEST_FILE = "prometheus/rules_test.yml"
ANOMALY_TEST_FILE = "prometheus/anomaly_rules_test.yml"  # a day per group: its own grid
ALERTMANAGER_FILE = "alertmanager/alertmanager.yml"
RUNBOOKS_DIR = "runbooks"


def write_alerts(
    spec: SLOSpec,
    out: Path,
    links: Links | None = None,
    webhook_url: str = DEFAULT_WEBHOOK_URL,
    timing: Timing | None = None,
    slow_interval: str | None = "1m",
    http_config: dict[str, Any] | None = None,
) -> list[Path]:
    """Write rules, their tests, the Alertmanager config and runbooks under `out`;
    `slow_interval` is the slow rule groups' (None: Prometheus' evaluation interval);
    `http_config` (authorization, TLS) goes under every Alertmanager webhook."""
    links = links or Links()
    files = {
        RULES_FILE: render_rules(spec, links, slow_interval),
        RULES_TEST_FILE: render_rules_test(spec, links, rules_file=Path(RULES_FILE).name),
        ANOMALY_TEST_FILE: render_anomaly_test(
            spec, links, Path(RULES_FILE).name, Path(ANOMALY_TEST_FILE).name
        ),
        ALERTMANAGER_FILE: render_alertmanager(spec, webhook_url, timing, http_config),
    }
    for name, text in render_runbooks(spec).items():
        files[f"{RUNBOOKS_DIR}/{name}.md"] = text
    return write_tree(out, files)


__all__ = [
    "ALERTMANAGER_FILE",
    "ANOMALY_TEST_FILE",
    "DEFAULT_WEBHOOK_URL",
    "RULES_FILE",
    "RULES_TEST_FILE",
    "RUNBOOKS_DIR",
    "Links",
    "Timing",
    "render_alertmanager",
    "render_rules",
    "render_rules_test",
    "render_runbooks",
    "routes",
    "write_alerts",
]
