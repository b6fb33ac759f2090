"""`slo demo --scenario overload` end to end (short): two acts against real `slo serve`
processes, the side-by-side report in the terminal and as HTML, each act's server records."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")


def test_overload_demo_runs_both_acts_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "slo.cli", "demo", "--scenario", "overload", "--out", str(out),
         "--calm", "1", "--flood", "4", "--flood-clients", "4"],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.split() == ["fifo", "slo"])
    assert header
    for label in (
        "premium p95 TTFT",
        "premium p99 ITL",
        "batch tokens/s",
        "premium burn-rate alert",
    ):
        row = next(line for line in lines if line.startswith(label))
        assert len(row[len(label) :].split()) >= 2  # a value per act
    failures = next(line for line in lines if line.startswith("batch failures")).split()[-2:]
    assert failures == ["0", "0"]
    assert "queue" in result.stdout and "decode" in result.stdout
    report = (out / "overload.html").read_text()
    assert "fifo" in report and "slo" in report
    assert (out / "overload-fifo.db").is_file() and (out / "overload-slo.db").is_file()
    assert (out / "overload.yaml").is_file()
