"""`slo demo` from the command line: serve, bench, judge, report, generate; exit 0, files named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slo.records import read_jsonl

pytest.importorskip("torch")  # the demo serves the bundled engine


def test_the_demo_runs_end_to_end_and_says_where_everything_went(tmp_path: Path) -> None:
    out = tmp_path / "tour"
    command = [sys.executable, "-m", "slo.cli", "demo", "--out", str(out),
               "--requests", "16", "--rate", "8", "--quiet"]  # fmt: skip
    # The default demo (60 requests) takes well under a minute on two cores (16 requests: 25-32
    # s here); the limit guards against a hang, with room for a first run on a cold machine
    # (one CI run in a fresh virtualenv went past two minutes).
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    printed = result.stdout

    records = read_jsonl(out / "results.jsonl")
    assert len(records) == 16
    assert {r.tier for r in records} <= {"premium", "standard", "batch"}
    assert all(r.client_ttft_s is not None and r.ttft_s is not None for r in records)
    assert ("goodput" in printed and "tier premium" in printed) or "tier standard" in printed

    expected = {
        out / "slo.yaml": "the SLO spec",
        out / "results.jsonl": "16 request records",
        out / "report.html": "offline HTML",
        out / "metrics.prom": "/metrics",
        out / "slo.json": "/slo",
        out / "prometheus": "rules",
        out / "grafana": "Grafana",
        out / "alertmanager": "Alertmanager",
        out / "runbooks": "runbook",
    }
    for path, description in expected.items():
        assert path.exists(), path
        line = next((line for line in printed.splitlines() if str(path) in line), "")
        assert description in line, (path, printed[-2000:])
    assert (out / "report.html").read_text().count("<svg") == 7
    assert (out / "prometheus" / "rules.yml").is_file()
    assert list((out / "grafana").glob("*.json"))
    assert "llm_slo_requests_total" in (out / "metrics.prom").read_text()
