"""The charts of `slo report`, drawn by matplotlib as inline SVG (no pyplot: no global state).

Every chart reads the client's view of an SLI where a record has one (what the person waiting
saw) and the server's otherwise, the same choice `slo check` makes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from slo.check.evaluate import EvaluationReport, nearest_rank
from slo.check.summary import PHASE_COLUMNS, sli_values
from slo.cli.report.blame_chart import blame_chart
from slo.cli.report.figures import PALETTE, new_figure, no_data, to_svg
from slo.cli.report.industry_chart import industry_chart
from slo.spec import SLOSpec
from slo.store.columns import RecordColumns

PERCENTILES = (50, 90, 95, 99)
MAX_POINTS = 4000  # scatter points per chart: beyond this the SVG grows, the picture does not


def tier_colors(spec: SLOSpec, columns: RecordColumns) -> dict[str, str]:
    names = [tier.name for tier in spec.tiers]
    names += sorted(set(columns.tier.tolist()) - set(names))
    return {name: PALETTE[index % len(PALETTE)] for index, name in enumerate(names)}


def _tiers(spec: SLOSpec, columns: RecordColumns) -> Iterator[tuple[str, str, RecordColumns]]:
    """(tier, colour, its ok records) for every tier with records, in spec order."""
    ok = columns.outcome == "ok"
    for name, color in tier_colors(spec, columns).items():
        mask = ok & (columns.tier == name)
        if mask.any():
            yield name, color, columns.select(mask)


def _clean(values: np.ndarray) -> np.ndarray:
    return values[~np.isnan(values)]


def _thresholds(spec: SLOSpec, tier: str, sli: str) -> list[tuple[float, str]]:
    try:
        objectives = spec.tier(tier).latency_objectives
    except KeyError:
        return []
    return [(o.threshold_s or 0.0, o.name) for o in objectives if o.sli == sli]


SLI_PANELS = (("ttft", "ttft_s", "TTFT"), ("tpot", "tpot_s", "TPOT"), ("e2e", "e2e_s", "e2e"))


def value_scale(bars: Sequence[float], lines: Sequence[float]) -> tuple[str, tuple[float, float]]:
    """("log" | "linear", y limits) showing every bar and every threshold line readably.

    A threshold far above the bars (10 s against bars of 20 ms) flattens them on a linear axis:
    past a tenfold spread the axis goes logarithmic, from below the smallest bar to above the
    highest line, so both are read off the same axis."""
    positive = [v for v in (*bars, *lines) if v > 0]
    if not positive:
        return "linear", (0.0, 1.0)
    top = max(positive)
    smallest_bar = min((v for v in bars if v > 0), default=top)
    if top / smallest_bar > 10:
        return "log", (smallest_bar / 2, top * 2)
    return "linear", (0.0, top * 1.15)


def percentile_chart(spec: SLOSpec, columns: RecordColumns) -> str:
    return to_svg(percentile_figure(spec, columns), "percentiles")


def percentile_figure(spec: SLOSpec, columns: RecordColumns) -> Figure:
    """p50/p90/p95/p99 per tier for TTFT, TPOT and e2e, with each tier's SLO thresholds."""
    figure = new_figure(11, 3.8)
    axes_row = figure.subplots(1, 3)
    tiers = list(_tiers(spec, columns))
    width = 0.8 / len(PERCENTILES)
    shades = (0.35, 0.55, 0.8, 1.0)
    for axes, (sli, field_name, label) in zip(axes_row, SLI_PANELS, strict=True):
        bars: list[float] = []
        lines: list[float] = []
        for index, (name, color, rows) in enumerate(tiers):
            values = _clean(sli_values(rows, field_name))
            if values.size == 0:
                continue
            for k, (q, alpha) in enumerate(zip(PERCENTILES, shades, strict=True)):
                x = index - 0.4 + width * (k + 0.5)
                bars.append(nearest_rank(values, q / 100) * 1e3)
                axes.bar(
                    x,
                    bars[-1],
                    width,
                    color=color,
                    alpha=alpha,
                    label=f"p{q}" if index == 0 else None,
                )
            for threshold, objective in _thresholds(spec, name, sli):
                lines.append(threshold * 1e3)
                axes.hlines(
                    threshold * 1e3,
                    index - 0.45,
                    index + 0.45,
                    colors="#c00",
                    linestyles="dashed",
                    linewidth=1.5,
                )
                axes.annotate(
                    objective,
                    (index, threshold * 1e3),
                    textcoords="offset points",
                    xytext=(0, 3),
                    ha="center",
                    fontsize=7,
                    color="#c00",
                )
        scale, limits = value_scale(bars, lines)
        if scale == "log":
            axes.set_yscale("log")
        axes.set_ylim(*limits)
        axes.set_title(f"{label} percentiles (ms{', log scale' if scale == 'log' else ''})")
        axes.set_xticks(range(len(tiers)), [name for name, _, _ in tiers])
        if not bars:
            no_data(axes, label)
        elif axes is axes_row[0]:
            axes.legend(fontsize=7, title="shade", title_fontsize=7)
        axes.grid(axis="y", alpha=0.3)
    return figure


PHASE_LABELS = {
    "queue_s": "queue",
    "prefill_s": "prefill",
    "queue_prefill_s": "queue + prefill (not split)",
    "decode_s": "decode",
    "detokenize_s": "detokenize",
    "other_s": "other",
    "network_s": "network (server)",
    "client_network": "network (client - server)",
}
PHASE_COLORS = (
    "#8172b3",
    "#dd8452",
    "#c44e52",
    "#4c72b0",
    "#64b5cd",
    "#937860",
    "#55a868",
    "#8c8c8c",
)


def phase_chart(spec: SLOSpec, columns: RecordColumns) -> str:
    """Mean time per phase and tier, stacked: where a request's time goes."""
    tiers = list(_tiers(spec, columns))
    figure = new_figure(10, 1.2 + 0.6 * max(1, len(tiers)))
    axes = figure.subplots()
    axes.set_title("where the time goes: mean per phase (ms), ok requests")
    drawn = False
    for row, (_, _, rows) in enumerate(tiers):
        left = 0.0
        parts = [(p, rows.numbers.get(p)) for p in PHASE_COLUMNS]
        client_e2e, server_e2e = rows.numbers.get("client_e2e_s"), rows.numbers.get("e2e_s")
        if client_e2e is not None and server_e2e is not None:
            parts.append(("client_network", np.clip(client_e2e - server_e2e, 0, None)))
        for (phase, values), color in zip(parts, PHASE_COLORS, strict=False):
            if values is None or np.isnan(values).all():
                continue
            mean = float(np.nanmean(values)) * 1e3
            axes.barh(
                row, mean, left=left, color=color, label=PHASE_LABELS[phase] if row == 0 else None
            )
            left += mean
            drawn = True
    axes.set_yticks(range(len(tiers)), [name for name, _, _ in tiers])
    axes.invert_yaxis()
    if drawn:
        axes.legend(fontsize=7, ncol=7, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    else:
        no_data(axes, "phase timings")
    axes.grid(axis="x", alpha=0.3)
    return to_svg(figure, "phases")


def cdf_chart(spec: SLOSpec, columns: RecordColumns) -> str:
    """Cumulative distributions of TTFT and TPOT per tier, with the SLO thresholds."""
    figure = new_figure(11, 3.6)
    for axes, (sli, field_name, label) in zip(figure.subplots(1, 2), SLI_PANELS[:2], strict=True):
        axes.set_title(f"{label} CDF")
        axes.set_xlabel("ms")
        axes.set_ylabel("fraction of requests")
        drawn = False
        for name, color, rows in _tiers(spec, columns):
            values = np.sort(_clean(sli_values(rows, field_name)))
            if values.size == 0:
                continue
            drawn = True
            fractions = np.arange(1, values.size + 1) / values.size
            axes.step(values * 1e3, fractions, where="post", color=color, label=name)
            for threshold, objective in _thresholds(spec, name, sli):
                axes.axvline(threshold * 1e3, color=color, linestyle="dashed", linewidth=1)
                axes.annotate(
                    f"{name}: {objective}",
                    (threshold * 1e3, 0.02),
                    rotation=90,
                    fontsize=7,
                    color=color,
                    ha="right",
                    va="bottom",
                )
        if drawn:
            axes.legend(fontsize=7, loc="lower right")
        else:
            no_data(axes, label)
        axes.set_ylim(0, 1.02)
        axes.grid(alpha=0.3)
    return to_svg(figure, "cdf")


def _thin(count: int, limit: int = MAX_POINTS) -> np.ndarray:
    """Evenly spaced row indices, at most `limit` (deterministic, keeps the shape)."""
    return np.unique(np.linspace(0, count - 1, min(count, limit)).astype(int))


def ttft_input_chart(spec: SLOSpec, columns: RecordColumns) -> str:
    figure = new_figure(10, 3.6)
    axes = figure.subplots()
    axes.set_title("TTFT against prompt length")
    axes.set_xlabel("input tokens")
    axes.set_ylabel("TTFT (ms)")
    drawn = False
    for name, color, rows in _tiers(spec, columns):
        ttft, tokens = sli_values(rows, "ttft_s"), rows.number("input_tokens")
        keep = ~np.isnan(ttft) & ~np.isnan(tokens)
        if not keep.any():
            continue
        drawn = True
        index = _thin(int(keep.sum()))
        axes.scatter(
            tokens[keep][index], ttft[keep][index] * 1e3, s=10, color=color, alpha=0.6, label=name
        )
    if drawn:
        axes.legend(fontsize=7)
    else:
        no_data(axes, "TTFT")
    axes.grid(alpha=0.3)
    return to_svg(figure, "ttft-input")


def over_time_chart(spec: SLOSpec, columns: RecordColumns) -> str:
    """TTFT and e2e of each request at its start time: does latency drift during the run?"""
    figure = new_figure(11, 3.6)
    start = float(np.nanmin(columns.number("timestamp"))) if len(columns) else 0.0
    panels = (SLI_PANELS[0], SLI_PANELS[2])
    for axes, (_, field_name, label) in zip(
        figure.subplots(1, 2, sharex=True), panels, strict=True
    ):
        axes.set_title(f"{label} over the run")
        axes.set_xlabel("seconds since the first request")
        axes.set_ylabel("ms")
        drawn = False
        for name, color, rows in _tiers(spec, columns):
            values = sli_values(rows, field_name)
            keep = ~np.isnan(values)
            if not keep.any():
                continue
            drawn = True
            when = rows.number("timestamp")[keep] - start
            order = np.argsort(when)[_thin(int(keep.sum()))]
            axes.scatter(
                when[order], values[keep][order] * 1e3, s=8, color=color, alpha=0.6, label=name
            )
        if drawn:
            axes.legend(fontsize=7)
        else:
            no_data(axes, label)
        axes.grid(alpha=0.3)
    return to_svg(figure, "over-time")


def all_charts(
    spec: SLOSpec,
    columns: RecordColumns,
    report: EvaluationReport,
    rows: Sequence[Mapping[str, Any]] = (),
) -> Sequence[tuple[str, str, str]]:
    """(id, caption, svg) of every chart, in page order; `rows`: the records as read (the
    blame chart reads their `delay_blame`)."""
    colors = tier_colors(spec, columns)
    return (
        (
            "percentiles",
            "Percentiles per tier; dashed red: the tier's SLO threshold (a log "
            "axis where a threshold is far above the bars).",
            percentile_chart(spec, columns),
        ),
        (
            "phases",
            "Mean time per phase; the grey tail is time the server cannot see "
            "(client e2e - server e2e).",
            phase_chart(spec, columns),
        ),
        (
            "cdf",
            "Cumulative distributions; dashed: each tier's thresholds.",
            cdf_chart(spec, columns),
        ),
        ("ttft-input", "Longer prompts take longer to prefill.", ttft_input_chart(spec, columns)),
        (
            "over-time",
            "Latency across the run: drift or bursts show here.",
            over_time_chart(spec, columns),
        ),
        (
            "industry",
            "Where each tier sits among the industry's performance tiers.",
            industry_chart(report, colors),
        ),
        (
            "blame",
            "Who made each tier wait: its blamed seconds by culprit tier (colour) and cause "
            "(hatch), exact from the bundled engine, estimated by slo proxy.",
            blame_chart(rows, colors),
        ),
    )
