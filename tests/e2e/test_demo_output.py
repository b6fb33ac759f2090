"""What a new user sees first: `slo demo`'s terminal output fits 100 columns, cuts no header,
shows no column of zeros, and the packaged spec draws no note from `slo generate`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.terminal_tables import empty_columns, tables, too_wide

pytest.importorskip("torch")  # the demo serves the bundled engine


def test_the_demo_prints_narrow_tables_that_each_hold_something(tmp_path: Path) -> None:
    out = tmp_path / "tour"
    command = [sys.executable, "-m", "slo.cli", "demo", "--out", str(out),
               "--requests", "16", "--rate", "8", "--quiet"]  # fmt: skip
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    printed = result.stdout + result.stderr

    # Lines that name the output directory are as long as the path the user chose.
    wide = [line for line in too_wide(printed) if str(out) not in line]
    assert wide == [], "\n".join(wide)
    assert "…" not in printed, printed
    assert "note:" not in printed, printed  # the packaged spec can alert on all it sets
    assert empty_columns(printed) == [], printed

    found = tables(printed)
    latency, phases, *verdicts = found
    assert "TTFT p95" in latency and "goodput" in latency
    # The bundled engine splits queue and prefill: the column of their sum would be zeros.
    assert {"queue", "prefill", "decode"} <= set(phases) and "queue+prefill" not in phases
    assert verdicts and all("verdict" in table for table in verdicts)
