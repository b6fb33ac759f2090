"""`slo report`'s "who made each tier wait" chart, from the records' `delay_blame`.

One bar per tier that has blame: its blamed seconds split by culprit tier (the colour, the
culprit's own tier colour; grey for queue time with nobody ahead) and cause (the hatch), as
shares of the tier's total, the same picture `/slo.html` names in words (docs/blame.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from slo.blame_shares import blame_by_tier
from slo.cli.report.figures import new_figure, no_data, to_svg
from slo.engine_slis import DELAY_CAUSES, NO_CULPRIT

HATCHES = {"queue": "", "interference": "///", "preemption": "xx"}
NOBODY_COLOR = "#bbbbbb"


def blame_chart(rows: Iterable[Mapping[str, Any]], colors: Mapping[str, str]) -> str:
    return to_svg(blame_figure(rows, colors), "blame")


def blame_figure(rows: Iterable[Mapping[str, Any]], colors: Mapping[str, str]) -> Figure:
    """Stacked shares per tier, in the order of `colors` (the spec's), tiers without blame
    left out; each bar labelled with its blamed seconds and records."""
    by_tier = blame_by_tier(rows)
    names = [name for name in colors if by_tier.get(name) and by_tier[name].total_s > 0]
    names += sorted(set(by_tier) - set(names) - set(colors))
    figure = new_figure(10, 1.4 + 0.6 * max(1, len(names)))
    axes = figure.subplots()
    axes.set_title(
        "who made each tier wait: share of its blamed seconds, by culprit tier and cause"
    )
    culprits: dict[str, str] = {}
    for row, name in enumerate(names):
        tier = by_tier[name]
        left = 0.0
        for (culprit, cause), share in sorted(tier.shares().items(), key=lambda kv: -kv[1]):
            color = NOBODY_COLOR if culprit == NO_CULPRIT else colors.get(culprit, "#666666")
            culprits.setdefault(culprit, color)
            axes.barh(row, share, left=left, color=color, hatch=HATCHES.get(cause, ".."))
            if share >= 0.08:
                axes.text(left + share / 2, row, f"{share:.0%}", ha="center", va="center",
                          fontsize=8, color="white")  # fmt: skip
            left += share
        estimated = ", estimated" if tier.estimated else ""
        axes.text(1.01, row, f"{tier.total_s:.3g} s over {tier.requests} requests{estimated}",
                  va="center", fontsize=8)  # fmt: skip
    if not names:
        no_data(axes, "delay blame (the bundled engine's, or slo proxy --estimate-blame's)")
        return figure
    axes.set_yticks(range(len(names)), names)
    axes.invert_yaxis()
    axes.set_xlim(0, 1)
    axes.xaxis.set_major_formatter(lambda value, _: f"{value:.0%}")
    legend = [Patch(color=color, label=_culprit_label(c)) for c, color in culprits.items()]
    legend += [Patch(facecolor="white", edgecolor="#333", hatch=HATCHES[c], label=c)
               for c in DELAY_CAUSES]  # fmt: skip
    axes.legend(handles=legend, fontsize=7, ncol=len(legend), loc="upper center",
                bbox_to_anchor=(0.5, -0.3))  # fmt: skip
    axes.grid(axis="x", alpha=0.3)
    return figure


def _culprit_label(culprit: str) -> str:
    return "nobody ahead" if culprit == NO_CULPRIT else f"by {culprit}"
