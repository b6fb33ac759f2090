"""`slo report --capacity`: the chart of a capacity search, its knee and baseline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slo.cli import main


def _document() -> dict[str, object]:
    def step(
        index: int, rate: float, verdict: str, goodput: float, ttft: float
    ) -> dict[str, object]:
        objective = {
            "objective": "p90 ttft <= 50ms",
            "verdict": "met" if ttft <= 0.05 else "violated",
            "observed_s": ttft,
            "threshold_s": 0.05,
            "severity": ttft / 0.05,
        }
        return {
            "step": index,
            "rate": rate,
            "verdict": verdict,
            "goodput_rps": goodput,
            "throughput_rps": goodput,
            "measured_requests": 100,
            "stopped_early": None,
            "tiers": {"premium": {"verdict": verdict, "objectives": [objective]}},
        }

    return {
        "version": 1,
        "mode": "rate",
        "max_rate": 40.0,
        "per_tier": {"premium": {"max_rate": 40.0, "binding_objective": "p90 ttft <= 50ms"}},
        "steps": [
            step(1, 32, "pass", 31.5, 0.01),
            step(2, 64, "fail", 20.0, 0.4),
            step(3, 48, "fail", 30.0, 0.2),
            step(4, 40, "pass", 39.0, 0.03),
        ],
    }


def test_the_capacity_page_marks_the_knee_and_the_baseline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "capacity.json").write_text(json.dumps(_document()))
    out, png = tmp_path / "capacity.html", tmp_path / "capacity.png"
    assert main(["report", "--capacity", str(tmp_path), "--out", str(out), "--png", str(png)]) == 0
    page = out.read_text()
    assert "<svg" in page and "capacity baseline 40 req/s" in page
    assert "knee at 40" in page and "premium: p90 ttft &lt;= 50ms" in page
    assert page.count("<tr>") == 5  # a header and a row a step
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_a_concurrency_search_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "capacity.json").write_text(json.dumps({"mode": "concurrency", "steps": []}))
    assert main(["report", "--capacity", str(tmp_path), "--out", str(tmp_path / "x.html")]) == 2
    assert "drawn for --find-max-rate runs" in capsys.readouterr().err
