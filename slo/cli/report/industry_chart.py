"""The industry chart of `slo report`: each tier's p95 TTFT against its p95 TPOT, on the boxes
of the industry's performance tiers (`slo.performance`)."""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from slo.check.evaluate import EvaluationReport
from slo.cli.report.figures import new_figure, no_data, to_svg
from slo.performance import LATENCY_TIERS


def log_limits(values: Sequence[float], box_edges: Sequence[float]) -> tuple[float, float]:
    """Log-axis limits holding every point and every performance-tier edge, with a margin:
    a p95 TTFT of 12 ms sits inside the axes, not under them."""
    every = [v for v in (*values, *box_edges) if v > 0]
    return min(every) / 1.6, max(every) * 1.6


def industry_chart(report: EvaluationReport, colors: dict[str, str]) -> str:
    return to_svg(industry_figure(report, colors), "industry")


def industry_figure(report: EvaluationReport, colors: dict[str, str]) -> Figure:
    """p95 TTFT against p95 TPOT per tier, on the industry's performance-tier boxes."""
    figure = new_figure(8, 4.2)
    axes = figure.subplots()
    axes.set_title("industry performance tiers (p95 TTFT, p95 TPOT)")
    axes.set_xscale("log")
    axes.set_yscale("log")
    shades = ("#1a9850", "#91cf60", "#d9ef8b", "#fee08b")
    for tier, shade in zip(reversed(LATENCY_TIERS), reversed(shades), strict=True):
        axes.add_patch(
            Rectangle(
                (1e-3, 1e-3),
                tier.ttft_max_s * 1e3 - 1e-3,
                tier.tpot_max_s * 1e3 - 1e-3,
                color=shade,
                alpha=0.55,
                label=tier.name,
            )
        )
    points = [(t.name, t.performance.ttft_p95_s, t.performance.tpot_p95_s) for t in report.tiers]
    drawn = [(n, x, y) for n, x, y in points if x is not None and y is not None]
    for index, (name, ttft, tpot) in enumerate(drawn):
        axes.scatter(
            [ttft * 1e3],
            [tpot * 1e3],
            s=60,
            color=colors.get(name, "#000"),
            edgecolors="black",
            zorder=3,
        )
        axes.annotate(
            name,
            (ttft * 1e3, tpot * 1e3),
            textcoords="offset points",
            xytext=(6, 4 + 10 * index),
            fontsize=8,
        )
    # Every box edge stays in view (the boxes are the scale the points are read against).
    axes.set_xlim(
        *log_limits([x * 1e3 for _, x, _ in drawn], [t.ttft_max_s * 1e3 for t in LATENCY_TIERS])
    )
    axes.set_ylim(
        *log_limits([y * 1e3 for _, _, y in drawn], [t.tpot_max_s * 1e3 for t in LATENCY_TIERS])
    )
    axes.set_xlabel("p95 TTFT (ms)")
    axes.set_ylabel("p95 TPOT (ms)")
    axes.legend(fontsize=7, loc="upper left")
    if not drawn:
        no_data(axes, "TTFT and TPOT")
    return figure
