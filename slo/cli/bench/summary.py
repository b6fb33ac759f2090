"""The per-tier tables `slo bench` and `slo demo` print, from the core's tier summaries.

Two tables that each fit 100 columns: how fast each tier was (the client's view), then where
its time went (the server's phases). A phase no tier spent time in is left out: the bundled
engine splits queue and prefill, so its `queue_prefill` column would be zeros, and an engine
seen only through the wire has no split queue and prefill.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from slo.check.summary import PHASE_COLUMNS, TierSummary, summarize
from slo.spec import SLOSpec
from slo.store.columns import RecordColumns

# Narrow enough for a terminal of 100 columns, the width every table of the CLI keeps to.
WIDTH = 100


def format_seconds(value: float | None) -> str:
    """Milliseconds below a second (a decimal below 10 ms), seconds above."""
    if value is None:
        return "-"
    if value >= 1:
        return f"{value:.2f} s"
    return f"{value * 1e3:.1f} ms" if value < 0.01 else f"{value * 1e3:.0f} ms"


def holds_something(values: Sequence[float | None]) -> bool:
    """Whether a column would show anything but dashes and zeros at 0.1 ms resolution."""
    return any(value is not None and round(value * 1e3, 1) > 0 for value in values)


def _network(summary: TierSummary) -> float | None:
    """The server's network time plus what only the client saw (client e2e - server e2e)."""
    network = summary.phase_means_s.get("network_s")
    if network is not None and summary.client_network_mean_s is not None:
        network += summary.client_network_mean_s
    return network


def _table(title: str, headers: Sequence[str]) -> Table:
    table = Table(title=title, title_justify="left")
    for header in headers:
        table.add_column(header, justify="left" if header == "tier" else "right", no_wrap=True)
    return table


def latency_table(summaries: Sequence[TierSummary]) -> Table:
    table = _table(
        "per tier, as the client saw it",
        ["tier", "requests", "ok", "TTFT p50", "TTFT p95", "TPOT p95", "e2e p95", "goodput"],
    )
    for summary in summaries:
        table.add_row(
            summary.tier,
            str(summary.requests),
            str(summary.ok),
            *(
                format_seconds(value)
                for value in (
                    summary.ttft_p50_s,
                    summary.ttft_p95_s,
                    summary.tpot_p95_s,
                    summary.e2e_p95_s,
                )
            ),
            f"{summary.good / summary.requests:.0%}" if summary.requests else "-",
        )
    return table


def phase_table(summaries: Sequence[TierSummary]) -> Table | None:
    """Mean time per ok request in each phase that holds something; None when none does."""
    columns = {
        field: [
            _network(summary) if field == "network_s" else summary.phase_means_s.get(field)
            for summary in summaries
        ]
        for field in PHASE_COLUMNS
    }
    shown = [field for field, values in columns.items() if holds_something(values)]
    if not shown:
        return None
    table = _table(
        "where the time went (the server's phases, mean per ok request)",
        ["tier", *(field.removesuffix("_s").replace("_", "+") for field in shown)],
    )
    for index, summary in enumerate(summaries):
        table.add_row(summary.tier, *(format_seconds(columns[field][index]) for field in shown))
    return table


def render_summary(spec: SLOSpec, columns: RecordColumns, elapsed_s: float) -> str:
    """The per-tier tables `slo bench` and `slo demo` print (plain text, at most 100 columns)."""
    summaries = summarize(spec, columns)
    buffer = io.StringIO()
    console = Console(file=buffer, width=WIDTH, force_terminal=False, no_color=True)
    console.print(latency_table(summaries))
    phases = phase_table(summaries)
    if phases is not None:
        console.print(phases)
    total = len(columns)
    good = sum(summary.good for summary in summaries)
    rate = good / elapsed_s if elapsed_s > 0 else 0.0
    console.print(
        f"{total} requests in {elapsed_s:.1f} s: "
        f"{total / elapsed_s if elapsed_s else 0:.2f} req/s, "
        f"goodput {rate:.2f} req/s ({good}/{total} met every latency objective of their tier). "
        "network = the server's own network time + (client e2e - server e2e)."
    )
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"
