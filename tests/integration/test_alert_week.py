"""The anomaly bands on a synthetic week (alerts/week_tests.py), through promtool: silent on
eight days of normal diurnal traffic with noise; a 2x slower prefill raises the TTFT info
alert within 10 minutes, naming prefill."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from alerts.rules import Links, group_order, render_rules
from alerts.templating import render
from alerts.week_tests import week_groups
from slo.spec import SLOSpec
from tests.helpers.binaries import binary

SPEC = SLOSpec.from_yaml(
    """
version: 1
window: 30d
tiers:
  - name: premium
    default: true
    objectives: [p95 ttft <= 200ms, availability >= 99.9%]
"""
)


@pytest.mark.timeout(900)
def test_week_of_diurnal_traffic(tmp_path: Path) -> None:
    promtool = binary("promtool")
    (tmp_path / "rules.yml").write_text(render_rules(SPEC, Links()))
    text = render(
        "rules_test.yml.j2",
        rules_file="rules.yml",
        evaluation_interval="5m",
        group_eval_order=group_order(SPEC),
        groups=week_groups(SPEC),
        source="test_alert_week",
    )
    (tmp_path / "rules_test.yml").write_text(text)
    started = time.monotonic()
    result = subprocess.run(
        [promtool, "test", "rules", "rules_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    print(f"promtool: {time.monotonic() - started:.0f} s")
