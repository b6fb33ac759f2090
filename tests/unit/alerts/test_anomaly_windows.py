"""The anomaly window widens at low traffic (alerts/anomaly_windows.py) and the generated
promtool tests prove it (alerts/anomaly_tests.py): rules that keep the 5m guard, as before
the windows widened, fail the 0.2 requests/s and 1h cases; rules that widen at normal traffic
fail the 5m case."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts import ANOMALY_TEST_FILE, RULES_FILE, write_alerts
from alerts.anomalies import ALERT_NAME, anomaly_annotations, anomaly_records
from alerts.anomaly_tests import cases
from alerts.anomaly_windows import WINDOWS_S, minutes
from alerts.rules import Links, render_rules
from slo.promql import (
    ANOMALY_SIGNAL_RECORD,
    ANOMALY_WINDOW_RECORD,
    prom_duration,
    requests_record,
)
from slo.spec import SLOSpec
from tests.helpers.binaries import binary

SPEC = """
version: 1
tiers:
  - name: premium
    default: true
    objectives: [p95 ttft <= 200ms]
"""
DURATION_READ = re.compile(r"(?:rate|increase)(\d+[mh])\b|\[(\d+[mh])\]")


def _spec(anomalies: str = "") -> SLOSpec:
    return SLOSpec.from_yaml(
        SPEC + (f"alert_policy:\n  anomalies:\n{anomalies}" if anomalies else "")
    )


def _window_rule(spec: SLOSpec) -> Any:
    (rule,) = [r for r in anomaly_records(spec, spec.tiers[0]) if r.record == ANOMALY_WINDOW_RECORD]
    return rule


def test_the_window_is_the_narrowest_holding_the_minimum_requests() -> None:
    rule = _window_rule(_spec("    min_requests: 40\n"))
    branches = rule.expr.split("\nor on (tier)\n")
    assert len(branches) == len(WINDOWS_S)
    for branch, window in zip(branches, WINDOWS_S, strict=True):
        count = f'{requests_record(window)}{{tier="premium"}}'
        assert branch == f"{minutes(window)} + 0 * ({count} >= 40)"


def test_every_signal_reads_each_window_only_while_it_is_the_tiers() -> None:
    spec = _spec()
    signals = [r for r in anomaly_records(spec, spec.tiers[0]) if r.record == ANOMALY_SIGNAL_RECORD]
    assert signals
    for rule in signals:
        branches = rule.expr.split("\nor\n(\n")
        assert len(branches) == len(WINDOWS_S), rule.expr
        for branch, window in zip(branches, WINDOWS_S, strict=True):
            gate = f'and on ()\n{ANOMALY_WINDOW_RECORD}{{tier="premium"}} == {minutes(window)}'
            assert branch.endswith(gate), branch
            read = {a or b for a, b in DURATION_READ.findall(branch)}
            assert read == {prom_duration(window)}, branch


def test_no_alert_guards_on_5_minutes_any_more() -> None:
    """The old guard (`requests:increase5m >= min_requests` on the alert) silenced a quiet
    tier; the signal itself now exists only while a window holds the minimum."""
    text = render_rules(_spec(), Links())
    alerts = [r for g in yaml.safe_load(text)["groups"] for r in g["rules"] if r.get("alert")]
    anomalies = [a for a in alerts if a["alert"] == ALERT_NAME]
    assert anomalies
    assert all(requests_record(300) not in a["expr"] for a in anomalies)


@pytest.mark.parametrize("least", [1, 40, 100, 500])
def test_each_case_has_the_traffic_of_its_window(least: int) -> None:
    spec = _spec(f"    min_requests: {least}\n")
    found = {}
    for case in cases(spec):
        holding = [w for w in WINDOWS_S if case.per_minute * w / 60 >= least]
        found[case.name] = holding[0] if holding else None
        assert found[case.name] == case.window_s, case
    assert list(found.values()) == [*WINDOWS_S, None]


def test_the_30m_case_is_the_quietest_hour_at_the_default_minimum() -> None:
    (case,) = [c for c in cases(_spec()) if c.window_s == 1800]
    assert case.per_minute / 60 == pytest.approx(0.2)
    assert case.check_s <= 1800


def test_the_description_names_the_window_read() -> None:
    spec = _spec()
    shown = anomaly_annotations(spec, "premium", "prefill_mean", Links(), window_shown=30)
    assert shown["description"].startswith("Over the last 30 minutes (the narrowest of 5m,")
    template = anomaly_annotations(spec, "premium", "prefill_mean", Links())["description"]
    assert f'printf "{ANOMALY_WINDOW_RECORD}{{tier=%q}}" $labels.tier' in template


def _narrowed(rules: dict[str, Any], only: float) -> None:
    """The window rule with one branch left: `only` whatever the traffic."""
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("record") == ANOMALY_WINDOW_RECORD:
                (branch,) = [
                    b
                    for b in rule["expr"].split("\nor on (tier)\n")
                    if b.startswith(f"{minutes(only)} + ")
                ]
                rule["expr"] = branch


def _promtool(folder: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [binary("promtool"), "test", "rules", Path(ANOMALY_TEST_FILE).name],
        cwd=folder / Path(ANOMALY_TEST_FILE).parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_rules_that_do_not_widen_or_always_widen_fail_the_generated_tests(
    tmp_path: Path,
) -> None:
    binary("promtool")
    spec = _spec()
    names = {c.name: c for c in cases(spec)}
    folders = {}
    for only in (WINDOWS_S[0], WINDOWS_S[1]):  # the old 5m guard; 30m even at normal traffic
        folder = tmp_path / prom_duration(only)
        write_alerts(spec, folder)
        rules = yaml.safe_load((folder / RULES_FILE).read_text())
        _narrowed(rules, only)
        (folder / RULES_FILE).write_text(yaml.safe_dump(rules, sort_keys=False))
        folders[only] = folder
    runs = {only: _promtool(folder) for only, folder in folders.items()}  # two at once
    reports = {only: run.communicate(timeout=600)[0] for only, run in runs.items()}
    failed = {only: _failures(report) for only, report in reports.items()}
    assert set(names) == {"5m", "30m", "1h", "quiet"}
    both = ("alert", "window")
    # Before the windows widened: at 0.2 requests/s (and in the 1h case) nothing fired.
    old = {(case, kind) for case in ("30m", "1h") for kind in both}
    assert failed[WINDOWS_S[0]] == old, reports[WINDOWS_S[0]][-3000:]
    # Widened at normal traffic: the 5m case's info comes late; the 1h case has no window.
    wide = {(case, kind) for case in ("5m", "1h") for kind in both}
    assert failed[WINDOWS_S[1]] == wide, reports[WINDOWS_S[1]][-3000:]


def _failures(report: str) -> set[tuple[str, str]]:
    """(case, "alert" or "window") of each failure promtool reports."""
    found, case = set(), ""
    for line in report.splitlines():
        if line.strip().startswith("name: "):
            case = line.rstrip(",").rsplit("window ", 1)[1]
        elif line.strip().startswith(f"alertname: {ALERT_NAME},"):
            found.add((case, "alert"))
        elif line.strip().startswith(f'expr: "{ANOMALY_WINDOW_RECORD}'):
            found.add((case, "window"))
    return found
