"""`slo generate`: rules that promtool accepts and whose generated tests pass, an Alertmanager
config that amtool accepts and routes as intended, importable dashboards, one runbook per alert.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts import ANOMALY_TEST_FILE, routes
from alerts.budget_alert import ALERT_NAME as BUDGET_ALERT
from dashboards import OVERVIEW_UID, panel_queries, substitute
from dashboards.genai_row import TITLE as GENAI_TITLE
from slo.alert_rules import alert_rules
from slo.cli import main
from slo.sli import CATALOG
from slo.spec import SLOSpec
from tests.helpers.binaries import binary

WEEK = """
version: 1
window: 7d
tiers:
  - name: interactive
    default: true
    objectives: [p95 ttft <= 250ms, p99 e2e <= 1.5s, availability >= 99.95%]
  - name: offline
    match: {header: x-llm-tier}
    objectives: [99% of requests tpot <= 120ms, availability >= 99%]
"""
SHORT = """
version: 1
window: 1h
tiers:
  - name: gold
    default: true
    objectives: [p95 ttft <= 250ms, 99.5% of gaps itl <= 75ms, p50 e2e <= 1.5s,
      availability >= 99.95%]
alert_policy:
  min_events: 5
  burn_rates:
    - {severity: page, long: 2m, short: 30s, factor: 10}
    - {severity: ticket, long: 10m, short: 1m, factor: 2}
  thresholds:
    - {percentile: 90, factor: 1.5, for: 1m}
"""
SPECS = {"example": None, "week": WEEK, "short": SHORT}
_FLOAT_ARTIFACT = re.compile(r"\d\.\d*(?:0{6,}|9{6,})\d")


def _run(*command: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=240, check=False
    )


@pytest.fixture(scope="module", params=list(SPECS))
def generated(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[SLOSpec, Path]:
    out = tmp_path_factory.mktemp(f"generated-{request.param}")
    text = SPECS[request.param]
    args = ["generate", "--out", str(out)]
    if text is not None:
        (out / "slo.yaml").write_text(text)
        args += ["--spec", str(out / "slo.yaml")]
    assert main(args) == 0
    spec = SLOSpec.load(out / "slo.yaml") if text is not None else SLOSpec.default()
    return spec, out


def test_rules_pass_promtool_lint(generated: tuple[SLOSpec, Path]) -> None:
    promtool = binary("promtool")
    _, out = generated
    result = _run(
        promtool, "check", "rules", "--lint=all", "--lint-fatal", str(out / "prometheus/rules.yml")
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_generated_promtool_tests_pass(generated: tuple[SLOSpec, Path]) -> None:
    promtool = binary("promtool")
    _, out = generated
    result = _run(promtool, "test", "rules", "rules_test.yml", cwd=out / "prometheus")
    assert result.returncode == 0, result.stdout + result.stderr


def test_generated_anomaly_tests_pass(generated: tuple[SLOSpec, Path]) -> None:
    """A day of traffic per group, on its own 5m grid: at 0.2 requests/s the prefill info
    fires through the 30m window, at normal traffic through the 5m one."""
    promtool = binary("promtool")
    _, out = generated
    tests = yaml.safe_load((out / ANOMALY_TEST_FILE).read_text())["tests"]
    assert any("window 30m" in group["name"] for group in tests)
    result = _run(promtool, "test", "rules", Path(ANOMALY_TEST_FILE).name, cwd=out / "prometheus")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_breach_healthy_and_low_traffic_tests(
    generated: tuple[SLOSpec, Path],
) -> None:
    spec, out = generated
    tests = yaml.safe_load((out / "prometheus/rules_test.yml").read_text())["tests"]
    fired = {
        (alert_test["alertname"], tuple(sorted(alert["exp_labels"].items())))
        for group in tests
        for alert_test in group["alert_rule_test"]
        for alert in alert_test.get("exp_alerts", [])
    }
    for rule in alert_rules(spec):
        assert (rule.name, tuple(sorted(rule.labels_with_phase().items()))) in fired, rule
    silent = {
        g["name"].rsplit(" ", 1)[1]
        for g in tests
        if not any(t["exp_alerts"] for t in g["alert_rule_test"])
    }
    assert {"healthy", "low", "present"} <= silent


def test_rules_numbers_are_exact_and_annotated(generated: tuple[SLOSpec, Path]) -> None:
    _, out = generated
    text = (out / "prometheus/rules.yml").read_text()
    assert not _FLOAT_ARTIFACT.search(text)
    groups = yaml.safe_load(text)["groups"]
    alerts = [rule for group in groups for rule in group["rules"] if "alert" in rule]
    for alert in alerts:
        assert alert["labels"]["severity"] in {"critical", "warning", "info"}
        labels = alert["labels"]
        latency = labels.get("sli") not in (None, "availability") or labels.get("anomaly") in (
            "ttft_p95",
            "tpot_p95",
            "e2e_p95",
        )
        # Who made the tier wait: on the SLO's own latency alerts, not the bands or the budget.
        culprit = latency and "anomaly" not in labels and alert["alert"] != BUDGET_ALERT
        assert set(alert["annotations"]) == {
            "summary",
            "description",
            "runbook_url",
            "dashboard_url",
            *(["phase"] if latency else []),
            *(["culprit"] if culprit else []),
        }
        assert (out / "runbooks" / f"{alert['alert']}.md").is_file()
    # Raw metrics only (recording rules are `level:metric:operation`, with colons).
    names = set(re.findall(r"(?<![:\w])(llm_slo_[a-z_]+?)(?:_bucket|_count|_sum)?\b(?!:)", text))
    assert names <= {sli.metric for sli in CATALOG.values()}  # nothing outside the catalog


def test_alertmanager_config_checks_and_routes_by_severity_and_tier(
    generated: tuple[SLOSpec, Path],
) -> None:
    amtool = binary("amtool")
    spec, out = generated
    config = out / "alertmanager/alertmanager.yml"
    result = _run(amtool, "check-config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    for labels, receiver in routes(spec):
        pairs = [f"{key}={value}" for key, value in labels.items()]
        result = _run(
            amtool,
            "config",
            "routes",
            "test",
            f"--config.file={config}",
            f"--verify.receivers={receiver}",
            *pairs,
        )
        assert result.returncode == 0, (labels, receiver, result.stdout + result.stderr)
    inhibit = yaml.safe_load(config.read_text())["inhibit_rules"][0]
    assert inhibit["source_matchers"] == ['severity="critical"'] and inhibit["equal"] == [
        "tier",
        "sli",
    ]


def test_dashboard_is_import_ready(generated: tuple[SLOSpec, Path]) -> None:
    _, out = generated
    model = json.loads((out / f"grafana/{OVERVIEW_UID}.json").read_text())
    assert model["uid"] == OVERVIEW_UID and model["schemaVersion"] >= 36
    variables = {v["name"]: v["type"] for v in model["templating"]["list"]}
    assert variables == {
        "datasource": "datasource",
        "tier": "query",
        "model": "query",
        "instance": "query",
    }
    queries = panel_queries(model)
    assert len({q.panel for q in queries}) >= 20
    for query in queries:
        if "rate(" in query.expr:
            assert "[$__rate_interval]" in query.expr, query
    quantiles = [q.expr for q in queries if "histogram_quantile" in q.expr]
    assert quantiles and all("_bucket" in expr for expr in quantiles)
    provisioning = yaml.safe_load(
        (out / "grafana/provisioning/dashboards/llm-slo.yaml").read_text()
    )
    assert provisioning["providers"][0]["type"] == "file"


def _all_panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for panel in panels for p in (panel, *_all_panels(panel.get("panels", [])))]


def _overlap(a: dict[str, int], b: dict[str, int]) -> bool:
    return (
        a["x"] < b["x"] + b["w"]
        and b["x"] < a["x"] + a["w"]
        and a["y"] < b["y"] + b["h"]
        and b["y"] < a["y"] + a["h"]
    )


def test_dashboard_fits_grafanas_panel_model(generated: tuple[SLOSpec, Path]) -> None:
    """What Grafana's dashboard model asks of panels: unique ids, positions on the 24-column
    grid that do not overlap, rows only at the top, each panel type with its own fields."""
    _, out = generated
    model = json.loads((out / f"grafana/{OVERVIEW_UID}.json").read_text())
    panels = _all_panels(model["panels"])
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in "hwxy"), panel["title"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["h"] > 0
        assert grid["x"] + grid["w"] <= 24, panel["title"]
    for index, panel in enumerate(panels):
        for other in panels[index + 1 :]:
            assert not _overlap(panel["gridPos"], other["gridPos"]), (
                panel["title"],
                other["title"],
            )
    nested = _all_panels([p for row in model["panels"] for p in row.get("panels", [])])
    assert all(panel["type"] != "row" for panel in nested)
    for panel in panels:
        assert panel["type"] in {"row", "timeseries", "text"}, panel["type"]
        if panel["type"] == "text":
            assert panel["options"]["mode"] == "markdown" and panel["options"]["content"]
        if panel["type"] == "timeseries":
            refs = [target["refId"] for target in panel["targets"]]
            assert refs and len(refs) == len(set(refs)), panel["title"]
            assert panel["datasource"]["uid"] == "${datasource}"


def test_every_legend_names_a_label_its_query_keeps(generated: tuple[SLOSpec, Path]) -> None:
    _, out = generated
    model = json.loads((out / f"grafana/{OVERVIEW_UID}.json").read_text())
    checked = 0
    for panel in _all_panels(model["panels"]):
        for target in panel.get("targets", []):
            clauses = re.findall(r"\bby \(([^)]*)\)", target["expr"])
            if not clauses:  # a selector or a recording rule keeps its labels
                continue
            kept = {label.strip() for clause in clauses for label in clause.split(",")}
            named = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target["legendFormat"]))
            assert named <= kept, (panel["title"], named - kept)
            checked += bool(named)
    assert checked >= 10


def test_genai_row_is_collapsed_with_its_notes_first(generated: tuple[SLOSpec, Path]) -> None:
    """The gen_ai_* series exist only when OpenTelemetry is on: their row is collapsed (its
    queries are optional, so an OpenTelemetry-off stack has no empty panel in sight) and says
    which series to use for what before its charts."""
    _, out = generated
    model = json.loads((out / f"grafana/{OVERVIEW_UID}.json").read_text())
    (row,) = [p for p in model["panels"] if p["type"] == "row" and p["title"] == GENAI_TITLE]
    assert row["collapsed"] is True
    notes, *charts = row["panels"]
    assert notes["type"] == "text" and notes["gridPos"]["w"] == 24
    assert notes["gridPos"]["y"] < min(chart["gridPos"]["y"] for chart in charts)
    assert "llm_slo_" in notes["options"]["content"]
    assert len(charts) == 4 and all(chart["type"] == "timeseries" for chart in charts)
    genai = [q for q in panel_queries(model) if "gen_ai_" in q.expr]
    assert len(genai) == 3 * 3 + 2 and all(q.optional for q in genai)


def test_every_panel_query_is_valid_promql(generated: tuple[SLOSpec, Path], tmp_path: Path) -> None:
    promtool = binary("promtool")
    _, out = generated
    model = json.loads((out / f"grafana/{OVERVIEW_UID}.json").read_text())
    rules = [
        {"record": f"panel:query:{index}", "expr": substitute(query.expr)}
        for index, query in enumerate(panel_queries(model))
    ]
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    result = _run(promtool, "check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_threshold_off_the_buckets_fails_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import slo.alert_rules

    def catalog_defaults_only(sli: str, spec: object = None) -> tuple[float, ...]:
        return CATALOG[sli].default_buckets  # as if the middleware ignored the spec

    monkeypatch.setattr(slo.alert_rules, "buckets_for", catalog_defaults_only)
    (tmp_path / "slo.yaml").write_text(WEEK)
    assert (
        main(["generate", "--spec", str(tmp_path / "slo.yaml"), "--out", str(tmp_path / "out")])
        == 2
    )
    error = capsys.readouterr().err
    assert "threshold 1.5s of 'p99 e2e <= 1.5s' is not a bucket bound" in error
    assert "slo.yaml:7" in error
    assert not (tmp_path / "out").exists()
