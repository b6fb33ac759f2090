"""`slo demo --scenario regression` end to end (short): the bundled engine in process, prefill
slowed by the engine's fault seam, the server's own records showing prefill grew, the live
page kept, and the generated rules (through promtool, over this run's measured traffic)
raising an info alert that names prefill."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.binaries import binary

pytest.importorskip("torch")


@pytest.mark.timeout(900)
def test_regression_demo_measures_the_slowdown_and_the_rules_name_prefill(tmp_path: Path) -> None:
    binary("promtool")
    out = tmp_path / "demo"
    command = [sys.executable, "-m", "slo.cli", "demo", "--scenario", "regression"]
    command += ["--out", str(out), "--calm", "4", "--slow", "8"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=850, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = (out / "regression.txt").read_text()
    prefill = re.search(r"^  prefill\s+([\d.]+) ms\s+([\d.]+) ms$", report, re.M)
    assert prefill, report
    before, after = (float(v) for v in prefill.groups())
    # The injected sleep is the healthy mean once more; a busy machine moves both acts.
    assert after > 1.3 * before, report
    fired = re.findall(r"^\s+\+\d+m\s+(\w+)\s+(\w+)\s+(.*)$", report, re.M)
    infos = [why for urgency, _, why in fired if urgency == "info"]
    assert any("phase=prefill" in why for why in infos), report
    assert all("phase=prefill" in why for urgency, _, why in fired if urgency == "page"), report
    for name in ("regression.yaml", "regression-live.yaml", "slo.json", "slo.html",
                 "regression.html", "regression.db"):  # fmt: skip
        assert (out / name).is_file(), name
    assert "LLMSLO" in (out / "regression.html").read_text()
