"""The per-tier table `slo bench` and `slo demo` print, from the core's tier summaries."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from slo.columns import RecordColumns
from slo.spec import SLOSpec
from slo.summary import summarize


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f} s" if value >= 10 else f"{value * 1e3:.0f} ms"


def render_summary(spec: SLOSpec, columns: RecordColumns, elapsed_s: float) -> str:
    """The per-tier table `slo bench` and `slo demo` print (plain text, fits 120 columns)."""
    summaries = summarize(spec, columns)
    buffer = io.StringIO()
    console = Console(file=buffer, width=130, force_terminal=False, no_color=True)
    table = Table(
        title="per tier (client view; phases are the server's means)", title_justify="left"
    )
    headers = ["tier", "requests", "ok", "TTFT p50", "TTFT p95", "TPOT p95", "e2e p95",
               "queue", "prefill", "q+prefill", "decode", "other", "network", "goodput"]  # fmt: skip
    for header in headers:
        table.add_column(header, justify="left" if header == "tier" else "right")
    for summary in summaries:
        phases = summary.phase_means_s
        network = phases.get("network_s")
        if network is not None and summary.client_network_mean_s is not None:
            network += summary.client_network_mean_s
        table.add_row(
            summary.tier, str(summary.requests), str(summary.ok),
            _ms(summary.ttft_p50_s), _ms(summary.ttft_p95_s), _ms(summary.tpot_p95_s),
            _ms(summary.e2e_p95_s), _ms(phases.get("queue_s")), _ms(phases.get("prefill_s")),
            _ms(phases.get("queue_prefill_s")),
            _ms(phases.get("decode_s")), _ms(phases.get("other_s")), _ms(network),
            f"{summary.good / summary.requests:.0%}" if summary.requests else "-",
        )  # fmt: skip
    console.print(table)
    total = len(columns)
    good = sum(summary.good for summary in summaries)
    rate = good / elapsed_s if elapsed_s > 0 else 0.0
    console.print(
        f"{total} requests in {elapsed_s:.1f} s: {total / elapsed_s if elapsed_s else 0:.2f} req/s, "
        f"goodput {rate:.2f} req/s ({good}/{total} met every latency objective of their tier). "
        "network = the server's own network time + (client e2e - server e2e)."
    )
    return buffer.getvalue()
