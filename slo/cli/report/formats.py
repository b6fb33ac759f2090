"""Render an EvaluationReport: a rich table, JSON, JUnit XML or Markdown (CI job summaries)."""

from __future__ import annotations

import io
import json
import math
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from slo.check.evaluate import EvaluationReport, ObjectiveResult
from slo.units import format_duration

VERDICT_MARK = {
    "met": "✅ met",
    "violated": "❌ violated",
    "insufficient_data": "⚠️ insufficient data",
}
VERDICT_STYLE = {"met": "green", "violated": "bold red", "insufficient_data": "yellow"}


def view_line(report: EvaluationReport) -> str:
    if report.view == "server":
        return "Latencies as measured by the server (no client-side timings in the records)."
    if report.view == "client":
        return "Latencies as the client saw them (client_* fields written by `slo bench`)."
    return (
        f"Latencies as the client saw them for {report.client_view_records} of "
        f"{report.records} records (client_* fields); server-side timings for the rest."
    )


def observed_text(result: ObjectiveResult, named: bool = True) -> str:
    """What was observed; `named=False` leaves out the percentile the objective already names."""
    objective = result.objective
    if objective.kind == "latency":
        if result.observed_s is None:
            return "-"
        value = format_duration_ms(result.observed_s)
        return f"p{objective.percentile:g} = {value}" if named else value
    if objective.kind == "throughput":
        return "-" if result.tokens_per_s is None else f"{result.tokens_per_s:,.0f} tokens/s"
    return "-" if result.attainment is None else f"{result.attainment * 100:.3f}%"


def format_duration_ms(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    return f"{seconds * 1e3:.1f} ms"


def _percent(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value * 100:.2f}%"


def _longest_burn(result: ObjectiveResult) -> str:
    """Burn over the shortest page window (the one that wakes people up), e.g. '1h: 0.4x'."""
    rates = [burn for burn in result.burn if burn.burn_rate is not None]
    if not rates:
        return "-"
    hour = next((burn for burn in rates if burn.window_s == 3600.0), rates[-1])
    return f"{format_duration(hour.window_s)}: {hour.burn_rate:.2f}x"


def _row(result: ObjectiveResult) -> list[str]:
    return [
        result.objective.name,
        str(result.events),
        observed_text(result),
        _percent(result.attainment),
        _percent(result.budget_remaining),
        _longest_burn(result),
        ", ".join(result.alerts) or "-",
        VERDICT_MARK[result.verdict],
    ]


HEADERS = [
    "objective",
    "events",
    "observed",
    "attainment",
    "budget left",
    "burn",
    "alerts",
    "verdict",
]


# The terminal's table keeps to 100 columns: the alerts that would fire (the widest cell) are
# listed under it, and a long objective name or verdict wraps inside its cell.
TEXT_WIDTH = 100
TEXT_HEADERS = [header for header in HEADERS if header != "alerts"]


def render_text(report: EvaluationReport, width: int = TEXT_WIDTH) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=False, no_color=True)
    for tier in report.tiers:
        console.print(_text_table(f"tier {tier.name} — {tier.requests} requests", tier.objectives))
        for result in tier.objectives:
            if result.alerts:
                _print_wrapped(
                    console, f"  would fire for {result.objective.name}: {', '.join(result.alerts)}"
                )
        _print_wrapped(
            console, f"  performance tier: {tier.performance.tier} ({tier.performance.reason})"
        )
    _print_wrapped(console, _summary(report))
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


def _text_table(title: str, results: Sequence[ObjectiveResult]) -> Table:
    rows = []
    for result in results:
        cells = _row(result)
        cells[HEADERS.index("observed")] = observed_text(result, named=False)
        del cells[HEADERS.index("alerts")]
        rows.append((cells, VERDICT_STYLE[result.verdict]))
    table = Table(title=title, title_justify="left")
    for index, header in enumerate(TEXT_HEADERS):
        # Nothing is cut: a column that wraps (the objective, the verdict) is at least as wide
        # as its longest word, header included; the others never wrap.
        words = [*header.split(), *(word for cells, _ in rows for word in cells[index].split())]
        table.add_column(
            header,
            justify="right" if header == "events" else "left",
            min_width=max(len(word) for word in words),
            max_width=12 if header == "verdict" else None,
            no_wrap=header not in ("objective", "verdict"),
        )
    for cells, style in rows:
        table.add_row(*cells, style=style)
    return table


def _print_wrapped(console: Console, text: str) -> None:
    """Plain text wrapped at the console's width, continuation lines indented."""
    for paragraph in text.splitlines():
        indent = " " * (len(paragraph) - len(paragraph.lstrip()) + 2)
        for line in textwrap.wrap(paragraph, console.width, subsequent_indent=indent) or [""]:
            console.print(line, markup=False, highlight=False, soft_wrap=True)


def _summary(report: EvaluationReport) -> str:
    results = report.results
    counts = {v: sum(r.verdict == v for r in results) for v in VERDICT_MARK}
    lines = [
        f"{report.records} records, window {format_duration(report.window_s)}: "
        f"{counts['met']} met, {counts['violated']} violated, "
        f"{counts['insufficient_data']} with insufficient data.",
        view_line(report),
        *report.notes,
    ]
    return "\n".join(lines)


def render_json(report: EvaluationReport) -> str:
    return json.dumps(report.to_dict(), indent=2) + "\n"


def render_markdown(report: EvaluationReport) -> str:
    lines = ["## SLO check", ""]
    for tier in report.tiers:
        lines += [f"### tier `{tier.name}` ({tier.requests} requests)", ""]
        lines.append("| " + " | ".join(HEADERS) + " |")
        lines.append("|" + "---|" * len(HEADERS))
        for result in tier.objectives:
            cells = [cell.replace("|", "\\|") for cell in _row(result)]
            cells[0] = f"`{cells[0]}`"
            lines.append("| " + " | ".join(cells) + " |")
        lines += [
            "",
            f"Performance tier: **{tier.performance.tier}** ({tier.performance.reason})",
            "",
        ]
    lines += [_summary(report).replace("\n", "\n\n"), ""]
    return "\n".join(lines)


def render_junit(report: EvaluationReport, strict: bool = False) -> str:
    """One testsuite per tier, one testcase per objective (JUnit XML as CI systems read it)."""
    suites = ET.Element("testsuites", name="slo check")
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    for tier in report.tiers:
        suite = ET.SubElement(suites, "testsuite", name=f"tier {tier.name}")
        counts = {"tests": 0, "failures": 0, "skipped": 0}
        for result in tier.objectives:
            counts["tests"] += 1
            case = ET.SubElement(
                suite,
                "testcase",
                classname=f"slo.{tier.name}",
                name=result.objective.name,
                time="0",
            )
            detail = (
                f"events={result.events} observed={observed_text(result)} "
                f"attainment={_percent(result.attainment)} "
                f"budget_left={_percent(result.budget_remaining)}"
            )
            if result.verdict == "violated":
                counts["failures"] += 1
                failure = ET.SubElement(case, "failure", type="violated")
                failure.set(
                    "message", f"{result.objective.name}: violated ({observed_text(result)})"
                )
                failure.text = detail
            elif result.verdict == "insufficient_data":
                message = f"insufficient data: {result.events} events"
                if strict:
                    counts["failures"] += 1
                    ET.SubElement(
                        case, "failure", type="insufficient_data", message=message
                    ).text = detail
                else:
                    counts["skipped"] += 1
                    ET.SubElement(case, "skipped", message=message)
            ET.SubElement(case, "system-out").text = detail
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
        suite.set("errors", "0")
    for key, value in totals.items():
        suites.set(key, str(value))
    suites.set("errors", "0")
    ET.indent(suites)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
    )
