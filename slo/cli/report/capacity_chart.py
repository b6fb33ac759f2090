"""`slo report --capacity`: a capacity search drawn against offered rate.

Top: goodput and throughput of each step against the rate offered, the offered rate itself
(the diagonal a server that keeps up follows), and the capacity baseline (max_rate) as a
line: the "throughput with capacity baseline" panel. Bottom: each tier's observed value of
each percentile objective against the rate, its threshold dashed. The knee (max_rate) is
marked on both.
"""

from __future__ import annotations

import html
from typing import Any

from matplotlib.figure import Figure

from slo.cli.report.figures import PALETTE, new_figure, to_svg

# What each step measured, drawn against the rate offered: (key, marker, colour, label).
_MEASURED = (
    ("throughput_rps", "o", PALETTE[0], "throughput (ok)"),
    ("goodput_rps", "s", PALETTE[2], "goodput"),
)


def _steps(document: dict[str, Any]) -> list[dict[str, Any]]:
    judged = [s for s in document["steps"] if s.get("verdict") in ("pass", "fail")]
    return sorted(judged, key=lambda step: step["rate"])


def capacity_figure(document: dict[str, Any]) -> Figure:
    steps = _steps(document)
    knee = document.get("max_rate")
    figure = new_figure(10.0, 6.4)
    top, bottom = figure.subplots(2, 1, sharex=True)
    rates = [s["rate"] for s in steps]
    top.plot(rates, rates, color="#bbb", linestyle=":", label="offered")
    for key, marker, color, label in _MEASURED:
        values = [s.get(key) or 0 for s in steps]
        top.plot(rates, values, marker=marker, color=color, label=label)
    if knee:
        top.axhline(knee, color=PALETTE[3], linewidth=1, label=f"capacity baseline {knee:g} req/s")
    top.set_ylabel("requests/s")
    top.set_title("throughput and goodput against offered rate")
    _objectives(bottom, steps)
    for axes in (top, bottom):
        if knee:
            axes.axvline(knee, color=PALETTE[3], linestyle="--", linewidth=1)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8, loc="upper left")
    bottom.set_xlabel("offered rate (requests/s)" + (f"; knee at {knee:g}" if knee else ""))
    return figure


def _objectives(axes: Any, steps: list[dict[str, Any]]) -> None:
    """Each tier's percentile objectives: observed per step, threshold dashed."""
    series: dict[tuple[str, str], list[tuple[float, float]]] = {}
    thresholds: dict[tuple[str, str], float] = {}
    for step in steps:
        for tier, result in step.get("tiers", {}).items():
            for objective in result.get("objectives", []):
                observed = objective.get("observed_s")
                if observed is None or objective.get("threshold_s") is None:
                    continue
                key = (tier, objective["objective"])
                series.setdefault(key, []).append((step["rate"], observed))
                thresholds[key] = objective["threshold_s"]
    for index, (key, points) in enumerate(sorted(series.items())):
        color = PALETTE[index % len(PALETTE)]
        axes.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            marker="o",
            color=color,
            label=f"{key[0]}: {key[1]}",
        )
        axes.axhline(thresholds[key], color=color, linestyle="--", linewidth=1)
    if series:
        axes.set_yscale("log")
    axes.set_ylabel("observed (s), threshold dashed")
    axes.set_title("each tier's percentile objectives against offered rate")


def render_capacity_page(document: dict[str, Any], title: str) -> str:
    svg = to_svg(capacity_figure(document), "capacity")
    rows = "".join(
        f"<tr><td>{s['step']}</td><td>{s['rate']:g}</td><td>{html.escape(s['verdict'])}</td>"
        f"<td>{s.get('goodput_rps') if s.get('goodput_rps') is not None else '-'}</td>"
        f"<td>{s['measured_requests']}</td>"
        f"<td>{html.escape(s.get('stopped_early') or '')}</td></tr>"
        for s in document["steps"]
    )
    tiers = "".join(
        f"<li>{html.escape(name)}: up to {tier.get('max_rate')} req/s; "
        f"{html.escape(tier.get('binding_objective') or tier.get('note', ''))}</li>"
        for name, tier in document.get("per_tier", {}).items()
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)} - llm-slo capacity</title></head><body>"
        f"<h1>Capacity: {html.escape(title)}</h1>"
        f"<p>max_rate {document.get('max_rate')} req/s</p><ul>{tiers}</ul>"
        f'<figure id="capacity">{svg}</figure>'
        "<table><tr><th>step</th><th>rate</th><th>verdict</th><th>goodput</th>"
        f"<th>measured</th><th>stopped early</th></tr>{rows}</table></body></html>\n"
    )
