"""`slo report`: one offline HTML page with the verdicts, the tables and seven charts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from slo.cli import main
from slo.cli.report.command import render_report
from slo.records import iter_jsonl_dicts
from slo.spec import SLOSpec

EXAMPLE = Path(__file__).resolve().parents[4] / "slo" / "examples" / "run.jsonl"
CHARTS = ("percentiles", "phases", "cdf", "ttft-input", "over-time", "industry")


@pytest.fixture(scope="module")
def page() -> str:
    return render_report(SLOSpec.default(), list(iter_jsonl_dicts(EXAMPLE)), "example run")


def test_every_chart_is_an_inline_svg_with_drawing_in_it(page: str) -> None:
    for chart in CHARTS:
        figure = re.search(rf'<figure id="{chart}">(.*?)</figure>', page, re.DOTALL)
        assert figure is not None, chart
        svg = figure.group(1)
        assert svg.startswith("<svg") and svg.count("<path") > 5, chart
    # clip-path ids must not collide between the charts of one page
    ids = re.findall(r'<clipPath id="([^"]+)"', page)
    assert len(ids) == len(set(ids))


def test_the_page_refers_to_nothing_outside_itself(page: str) -> None:
    references = re.findall(r"""(?:src|href)\s*=\s*["']?([^"'\s>]*)""", page, re.IGNORECASE)
    assert references and all(ref.startswith("#") for ref in references)  # SVG-internal only
    assert "url(http" not in page and "@import" not in page and "<script" not in page
    assert "<!DOCTYPE svg" not in page  # the DTD URL of a standalone SVG file is stripped


def test_verdicts_per_tier_and_the_industry_tier_are_on_the_page(page: str) -> None:
    for tier in ("premium", "standard", "batch"):
        assert f"<h3>tier {tier} (100 requests)</h3>" in page
    assert page.count('class="met"') == 10  # the example run meets all ten objectives
    assert "Optimized" in page and "better than typical" in page


def test_the_command_writes_the_file_and_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r" / "report.html"
    assert main(["report", "--results", str(EXAMPLE), "--out", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert str(out) in capsys.readouterr().out
    assert main(["report", "--results", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
