"""`slo report`: one self-contained HTML page from a run's records.

Everything is inline (CSS, SVG charts drawn by matplotlib), nothing is fetched, so the file
works offline and can be attached to a CI run. matplotlib is the optional `report` extra.
"""

from __future__ import annotations

import argparse
import datetime as dt
import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from slo.cli.common.flags import add_results_flag, add_spec_flag
from slo.errors import UsageError

HELP = "draw a run's records as one self-contained HTML report"
DESCRIPTION = (
    "Verdicts per tier, percentiles against the SLO lines, where the time went, "
    "CDFs, TTFT against input length, latency over the run and the industry performance "
    "tier, in one HTML file that works offline. Needs `pip install 'llm-slo[report]'`."
)
_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 1180px; color: #222; padding: 0 1em; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.meta { color: #555; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 4px 10px; text-align: left; }
th { background: #f5f5f5; } td.num { text-align: right; }
.met { color: #1a7f37; font-weight: 600; } .violated { color: #c00; font-weight: 700; }
.insufficient_data { color: #9a6700; }
figure { margin: 1em 0 2em; } figure svg { max-width: 100%; height: auto; display: block; }
figcaption { color: #555; font-size: 0.9em; }
"""
VERDICT_TEXT = {"met": "met", "violated": "violated", "insufficient_data": "insufficient data"}


def configure(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    add_results_flag(source)
    source.add_argument(
        "--capacity",
        metavar="DIR",
        help=(
            "a capacity search (slo bench --find-max-rate --out DIR): goodput and each tier's "
            "percentiles against offered rate"
        ),
    )
    parser.add_argument("--png", metavar="FILE", help="with --capacity: also the chart as a PNG")
    add_spec_flag(parser)
    parser.add_argument(
        "--out", default="report.html", help="HTML file to write (default: %(default)s)"
    )
    parser.add_argument("--title", default=None, help="page title (default: the results file name)")


def run(args: argparse.Namespace) -> int:
    from slo.records import iter_jsonl_dicts
    from slo.spec import SLOSpec

    if args.capacity:
        return _capacity(args)
    spec = SLOSpec.load(args.spec) if args.spec else SLOSpec.default()
    if not Path(args.results).is_file():
        raise UsageError(f"--results {args.results}: no such file")
    rows = list(iter_jsonl_dicts(args.results))
    out = write_report(spec, rows, Path(args.out), args.title or Path(args.results).name)
    print(f"wrote {out} ({out.stat().st_size // 1024} KiB, {len(rows)} records)")
    return 0


def _capacity(args: argparse.Namespace) -> int:
    from slo.capacity.result import read
    from slo.cli.report.capacity_chart import capacity_figure, render_capacity_page

    document = read(args.capacity)
    if document["mode"] != "rate":
        raise UsageError(f"--capacity {args.capacity}: the chart is drawn for --find-max-rate runs")
    out = Path(args.out)
    text = render_capacity_page(document, args.title or Path(args.capacity).name)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        if args.png:
            capacity_figure(document).savefig(args.png, format="png", dpi=100)
    except OSError as error:
        raise UsageError(f"--out {out}: cannot write ({error.strerror})") from None
    print(f"wrote {out}" + (f" and {args.png}" if args.png else ""))
    return 0


def write_report(spec: Any, rows: Sequence[Mapping[str, Any]], out: Path, title: str) -> Path:
    text = render_report(spec, rows, title)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    except OSError as error:
        raise UsageError(f"--out {out}: cannot write ({error.strerror})") from None
    return out


def render_report(spec: Any, rows: Sequence[Mapping[str, Any]], title: str) -> str:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(
            "slo report draws its charts with matplotlib: pip install 'llm-slo[report]'"
        ) from None
    from slo.check.evaluate import evaluate
    from slo.cli.report.charts import all_charts
    from slo.store.columns import RecordColumns

    if not rows:
        raise UsageError("the results hold no records; nothing to report")
    columns = RecordColumns.from_dicts(list(rows))
    report = evaluate(spec, columns)
    charts = "\n".join(
        f'<figure id="{chart_id}">{svg}<figcaption>{html.escape(caption)}</figcaption></figure>'
        for chart_id, caption, svg in all_charts(spec, columns, report, rows)
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)} - llm-slo report</title><style>{_CSS}</style></head><body>"
        f"<h1>SLO report: {html.escape(title)}</h1>{_meta(report, columns)}"
        f"<h2>Verdicts</h2>{_verdicts(report)}"
        f"<h2>Per tier</h2>{_tier_table(spec, columns)}"
        f"<h2>Industry position</h2>{_industry(report, spec, columns)}"
        f"<h2>Charts</h2>{charts}</body></html>\n"
    )


def _meta(report: Any, columns: Any) -> str:
    from slo.cli.report.formats import view_line

    starts = columns.number("timestamp")
    ends = starts + columns.number("e2e_s")
    began = dt.datetime.fromtimestamp(float(np.nanmin(starts)), dt.UTC)
    span = float(np.nanmax(ends) - np.nanmin(starts))
    notes = "".join(f'<p class="meta">{html.escape(note)}</p>' for note in report.notes)
    verdict = (
        "every objective met"
        if report.all_met
        else ("objectives violated" if report.any_violated else "some objectives lack data")
    )
    return (
        f'<p class="meta">{report.records} records over {span:.1f} s from '
        f"{began:%Y-%m-%d %H:%M:%S} UTC: <strong>{verdict}</strong>. "
        f"{html.escape(view_line(report))}</p>{notes}"
    )


def _percent(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value * 100:.2f}%"


def _verdicts(report: Any) -> str:
    from slo.cli.report.formats import observed_text

    parts = []
    for tier in report.tiers:
        body = "".join(
            f"<tr><td><code>{html.escape(result.objective.name)}</code></td>"
            f'<td class="num">{result.events}</td><td>{html.escape(observed_text(result))}</td>'
            f'<td class="num">{_percent(result.attainment)}</td>'
            f'<td class="num">{_percent(result.budget_remaining)}</td>'
            f'<td class="{result.verdict}">{VERDICT_TEXT[result.verdict]}</td></tr>'
            for result in tier.objectives
        )
        parts.append(
            f"<h3>tier {html.escape(tier.name)} ({tier.requests} requests)</h3><table><tr>"
            "<th>objective</th><th>events</th><th>observed</th><th>attainment</th>"
            f"<th>budget left</th><th>verdict</th></tr>{body}</table>"
        )
    return "".join(parts)


def _ms(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.2f} s" if value >= 10 else f"{value * 1e3:.1f} ms"


def _tier_table(spec: Any, columns: Any) -> str:
    from slo.check.summary import summarize

    span = float(
        np.nanmax(columns.number("timestamp") + columns.number("e2e_s"))
        - np.nanmin(columns.number("timestamp"))
    )
    rows = []
    for s in summarize(spec, columns):
        beyond = s.client_network_mean_s
        cells = [
            html.escape(s.tier),
            s.requests,
            s.ok,
            _ms(s.ttft_p50_s),
            _ms(s.ttft_p95_s),
            _ms(s.tpot_p95_s),
            _ms(s.e2e_p95_s),
            _ms(beyond),
            f"{s.good} ({s.good / s.requests:.0%}), {s.good / span if span > 0 else 0:.2f} req/s",
        ]
        rows.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    return (
        "<table><tr><th>tier</th><th>requests</th><th>ok</th><th>TTFT p50</th><th>TTFT p95</th>"
        "<th>TPOT p95</th><th>e2e p95</th><th>client - server e2e (mean)</th>"
        f'<th>goodput</th></tr>{"".join(rows)}</table><p class="meta">Goodput: ok and within '
        "every per-request latency objective of the tier (as <code>vllm bench serve "
        "--goodput</code>); the rate is over the run's span.</p>"
    )


def _industry(report: Any, spec: Any, columns: Any) -> str:
    from slo.check.evaluate import nearest_rank
    from slo.check.summary import sli_values
    from slo.performance import industry_position

    rows = []
    for tier in report.tiers:
        performance = tier.performance
        mask = (columns.tier == tier.name) & (columns.outcome == "ok")
        selected = columns.select(mask)
        positions = []
        for metric, field_name in (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("e2e", "e2e_s")):
            values = sli_values(selected, field_name)
            values = values[~np.isnan(values)]
            if values.size == 0:
                continue
            for q in (50, 95, 99):
                value = nearest_rank(values, q / 100)
                positions.append(
                    f"{metric} p{q} {_ms(value)}: {industry_position(metric, q, value)}"
                )
        rows.append(
            f"<tr><td>{html.escape(tier.name)}</td><td><strong>"
            f"{html.escape(performance.tier)}</strong></td><td>{html.escape(performance.reason)}"
            f"</td><td>{html.escape('; '.join(positions)) or '-'}</td></tr>"
        )
    return (
        "<table><tr><th>tier</th><th>performance tier</th><th>based on</th>"
        f"<th>against typical production figures</th></tr>{''.join(rows)}</table>"
    )
