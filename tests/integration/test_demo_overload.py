"""`slo demo --scenario overload` end to end (short): two acts against real `slo serve`
processes, the side-by-side report in the terminal and as HTML, each act's server records, and
the demo's story: under fifo the flood slows premium's first tokens; under the default flags,
where the spec's objectives choose the slo policy (as /health says), premium's burn-rate alert
stays quiet and its p95 TTFT stays under fifo's or within its objective."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")


def act_values(lines: list[str], label: str) -> list[str]:
    """The per-act values of the report row `label` (right-aligned columns, two spaces or more
    apart)."""
    row = next(line for line in lines if line.startswith(label))
    return re.split(r"\s{2,}", row.removeprefix(label).strip())


def test_overload_demo_runs_both_acts_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    # A flood of 12 clients for 6 s: under fifo premium waits behind ~880-token prompts for
    # most of a second (the alert fires within 2-3 s), under slo it stays near its 100 ms
    # objective even on a busy 2-core machine; 4 clients for 4 s left fifo's alert quiet.
    command = [sys.executable, "-m", "slo.cli", "demo", "--scenario", "overload"]
    command += ["--out", str(out), "--calm", "1", "--flood", "6", "--flood-clients", "12"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=400, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    # The second act's server ran without any scheduling flag, and /health said slo.
    header = next(line for line in lines if line.split() == ["fifo", "slo"])
    assert header
    assert act_values(lines, "scheduling flags") == ["--scheduling fifo", "default flags"]
    acts = {
        label: act_values(lines, label)
        for label in ("premium p95 TTFT", "premium p99 ITL", "batch tokens/s")
    }
    assert all(len(values) == 2 and all(values) for values in acts.values()), acts
    # The story: the flood slows premium's first tokens under fifo (whether its burn-rate
    # alert fires within a 6 s flood depends on how fast the machine is: on a quiet one fifo's
    # p95 can stay under 2x the objective); under the default flags premium stays fast and
    # its alert quiet.
    alert = act_values(lines, "premium burn-rate alert")
    assert alert[0] == "quiet" or alert[0].startswith("fired at +"), result.stdout
    assert alert[1] == "quiet", result.stdout
    # Premium's p95 TTFT under the default flags is under fifo's, or within its objective
    # (p95 ttft <= 100ms in the demo's spec): with prefill riding along decodes, fifo on a fast
    # quiet machine can keep premium near 65 ms too, and two 6 s acts differ by tens of ms.
    fifo_ttft, slo_ttft = (float(value.removesuffix(" ms")) for value in acts["premium p95 TTFT"])
    assert "p95 ttft <= 100ms" in (out / "overload.yaml").read_text()
    assert slo_ttft < fifo_ttft or slo_ttft <= 100.0, result.stdout
    failures = next(line for line in lines if line.startswith("batch failures")).split()[-2:]
    assert failures == ["0", "0"]
    assert "queue" in result.stdout and "decode" in result.stdout
    report = (out / "overload.html").read_text()
    assert "fifo" in report and "slo" in report
    assert (out / "overload-fifo.db").is_file() and (out / "overload-slo.db").is_file()
    assert (out / "overload.yaml").is_file()
