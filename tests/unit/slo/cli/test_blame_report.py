"""`slo report`'s blame chart: who made each tier wait, from the records' `delay_blame`, as
shares of each tier's blamed seconds by culprit tier and cause."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

from slo.cli import main
from slo.blame_shares import blame_by_tier
from slo.cli.report.blame_chart import blame_figure
from slo.records import iter_jsonl_dicts

EXAMPLE = Path(__file__).resolve().parents[4] / "slo" / "examples" / "run.jsonl"
COLORS = {"premium": "#4c72b0", "standard": "#dd8452", "batch": "#55a868"}


def delay_blame(*by_tier: tuple[str, str, float], estimated: bool = False) -> dict[str, Any]:
    blame: dict[str, Any] = {
        "queue_s": sum(s for cause, _, s in by_tier if cause == "queue"),
        "preempted_s": 0.0,
        "decode_s": 1.0,
        "decode_only_s": 0.5,
        "interference_s": sum(s for cause, _, s in by_tier if cause == "interference"),
        "by_tier": [{"cause": c, "tier": t, "s": s, "requests": 1} for c, t, s in by_tier],
        "top": [],
    }
    if estimated:
        blame["estimated"] = True
    return blame


def blamed_run(tmp_path: Path) -> Path:
    """The example run, premium's records blaming batch (0.3 s interference, 0.1 s queue)
    and premium (0.1 s queue) each, batch's blaming nobody (estimated)."""
    lines = []
    for row in iter_jsonl_dicts(EXAMPLE):
        if row["tier"] == "premium":
            row["delay_blame"] = delay_blame(
                ("interference", "batch", 0.3), ("queue", "batch", 0.1), ("queue", "premium", 0.1)
            )
        elif row["tier"] == "batch":
            row["delay_blame"] = delay_blame(("queue", "none", 0.2), estimated=True)
        lines.append(json.dumps(row))
    path = tmp_path / "blamed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_shares_sum_each_tiers_blame_over_its_records(tmp_path: Path) -> None:
    tiers = blame_by_tier(iter_jsonl_dicts(blamed_run(tmp_path)))
    assert set(tiers) == {"premium", "batch"}  # standard's records carry no blame
    premium = tiers["premium"]
    assert premium.requests == 100 and premium.total_s == pytest.approx(50.0)
    assert premium.shares() == pytest.approx(
        {("batch", "interference"): 0.6, ("batch", "queue"): 0.2, ("premium", "queue"): 0.2}
    )
    assert tiers["batch"].estimated and not premium.estimated


def test_the_chart_draws_a_bar_per_blamed_tier(tmp_path: Path) -> None:
    figure = blame_figure(list(iter_jsonl_dicts(blamed_run(tmp_path))), COLORS)
    (axes, *_) = figure.axes
    assert [label.get_text() for label in axes.get_yticklabels()] == ["premium", "batch"]
    widths = sorted(round(bar.get_width(), 6) for bar in axes.patches)
    assert widths == [0.2, 0.2, 0.6, 1.0]  # premium's three shares, batch's one
    texts = [text.get_text() for text in axes.texts]
    assert "60%" in texts and "50 s over 100 requests" in texts
    assert "20 s over 100 requests, estimated" in texts


def test_the_report_page_carries_the_chart(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert main(["report", "--results", str(blamed_run(tmp_path)), "--out", str(out)]) == 0
    page = out.read_text()
    figure = re.search(r'<figure id="blame">(.*?)</figure>', page, re.DOTALL)
    assert figure is not None
    assert "by batch" in figure.group(1) and "nobody ahead" in figure.group(1)


def test_records_without_blame_say_so() -> None:
    figure = blame_figure(list(iter_jsonl_dicts(EXAMPLE)), COLORS)
    assert any("no delay blame" in text.get_text() for text in figure.axes[0].texts)
