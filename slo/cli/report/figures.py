"""What every chart of `slo report` shares: the palette, a fresh figure (no pyplot: no global
state), the note on an empty chart, and the inline SVG it ends as."""

from __future__ import annotations

import io
import re

import matplotlib as mpl
from matplotlib.axes import Axes
from matplotlib.figure import Figure

PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3")
_STRIP = re.compile(r"<\?xml.*?\?>|<!DOCTYPE.*?>|<metadata>.*?</metadata>", re.DOTALL)


def to_svg(figure: Figure, name: str) -> str:
    buffer = io.StringIO()
    # A salt per chart keeps the ids of clip paths unique across the SVGs of one page.
    with mpl.rc_context({"svg.hashsalt": name, "svg.fonttype": "none"}):
        figure.savefig(buffer, format="svg", bbox_inches="tight")
    return _STRIP.sub("", buffer.getvalue()).strip()


def new_figure(width: float = 10.0, height: float = 3.6) -> Figure:
    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    figure.set_facecolor("white")
    return figure


def no_data(axes: Axes, what: str) -> None:
    axes.text(
        0.5,
        0.5,
        f"no {what} in these records",
        ha="center",
        va="center",
        transform=axes.transAxes,
        color="#888",
    )
