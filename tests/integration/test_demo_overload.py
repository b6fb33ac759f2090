"""`slo demo --scenario overload` end to end (short): two acts against real `slo serve`
processes, the side-by-side report in the terminal and as HTML, each act's server records, and
the demo's story: under fifo the flood takes premium's p95 TTFT past its objective; under the
default flags, where the spec's objectives choose the slo policy (as /health says), premium is
faster and its burn-rate alert stays quiet; and in both, the engine's blame names batch for
premium's waits."""

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
    # A flood of 24 clients for 6 s: under fifo premium waits behind their ~880-token prompts
    # (p95 TTFT 260-271 ms on a busy 2-core machine; 12 clients left it near 65 ms on a quiet
    # one), and under slo it is served first.
    command = [sys.executable, "-m", "slo.cli", "demo", "--scenario", "overload"]
    command += ["--out", str(out), "--calm", "1", "--flood", "6", "--flood-clients", "24"]
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
    # The story, by the spec's own objective (p95 ttft <= 100ms): the flood takes premium past
    # it under fifo; under the default flags premium is faster and its burn-rate alert, the
    # objective's judge, stays quiet. (One 6 s act's p95 swings with the machine: the slo act
    # read 44 ms, and 155 ms with three other test runs on the same 2 cores; whether fifo's
    # alert fires within the flood depends on the machine's speed too.)
    assert "p95 ttft <= 100ms" in (out / "overload.yaml").read_text()
    fifo_ttft, slo_ttft = (float(value.removesuffix(" ms")) for value in acts["premium p95 TTFT"])
    assert fifo_ttft > 100.0, f"fifo never hurt premium:\n{result.stdout}"
    assert slo_ttft < fifo_ttft, f"slo did not spare premium:\n{result.stdout}"
    assert act_values(lines, "premium burn-rate alert")[1] == "quiet", result.stdout
    # Who made premium wait, by the engine's exact blame in the server's records: under the
    # flood, at least 90% of premium's queue and interference blame that names a tier names
    # batch, in both acts.
    shares = [float(v.removesuffix("%")) for v in act_values(lines, "premium's wait named batch")]
    assert all(share >= 90 for share in shares), result.stdout
    failures = next(line for line in lines if line.startswith("batch failures")).split()[-2:]
    assert failures == ["0", "0"]
    assert "queue" in result.stdout and "decode" in result.stdout
    report = (out / "overload.html").read_text()
    assert "fifo" in report and "slo" in report
    assert (out / "overload-fifo.db").is_file() and (out / "overload-slo.db").is_file()
    assert (out / "overload.yaml").is_file()
