"""Open-loop latencies from the schedule: what a request waited since it was due to be sent.

An open-loop run fixes when each request is sent (the arrival process), whatever the server
does. The client's TTFT and e2e are measured from the actual send. When the client falls
behind its schedule (its own event loop busy, a machine stall), a request goes out late, and
the wait before the send is in neither time: coordinated omission, which hides the knee of a
server behind the client's lateness. Measured from the scheduled send, each latency is the
client's plus its send lag (`client_send_lag_s` in the record): what a user arriving on the
schedule waited. TPOT and ITL start at the first token and are the same in both views.

The two views differ, and the summary says so, when at p50, p95 or p99 of TTFT or e2e of a
tier the from-schedule value exceeds the from-send value by more than DIFFER_FLOOR_S and by
more than DIFFER_SHARE of the from-send value: 10 ms and 10%, so neither a millisecond of lag
on a fast TTFT nor 20 ms on a 10 s reply is called a difference.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from slo.check.evaluate import nearest_rank
from slo.cli.bench.summary import WIDTH, format_seconds

LAG_FIELD = "client_send_lag_s"
# The latencies that have a from-schedule view: (label, the client's record field).
VIEWS = (("TTFT", "client_ttft_s"), ("e2e", "client_e2e_s"))
DIFFER_FLOOR_S = 0.010
DIFFER_SHARE = 0.10
DIFFER_PERCENTILES = (0.50, 0.95, 0.99)

Record = Mapping[str, Any]


def has_schedule(records: Sequence[Record]) -> bool:
    """Whether the run was open loop: its records carry their send lag."""
    return any(record.get(LAG_FIELD) is not None for record in records)


def latencies(records: Sequence[Record], field: str, from_schedule: bool) -> np.ndarray:
    """The client's `field` of each ok request that has it and its lag, from the actual send
    or (from_schedule) from the scheduled one."""
    values = [
        float(record[field]) + (float(record[LAG_FIELD]) if from_schedule else 0.0)
        for record in records
        if record.get("outcome", "ok") == "ok"
        and record.get(field) is not None
        and record.get(LAG_FIELD) is not None
    ]
    return np.array(values, dtype=np.float64)


def percentile(values: np.ndarray, q: float) -> float | None:
    return nearest_rank(values, q) if values.size else None


def _tiers(records: Sequence[Record]) -> dict[str, list[Record]]:
    by_tier: dict[str, list[Record]] = {}
    for record in records:
        by_tier.setdefault(str(record.get("tier")), []).append(record)
    return by_tier


def differences(records: Sequence[Record]) -> list[str]:
    """Where the two views differ (the module docstring): per tier and latency, the percentile
    of the largest difference, as `premium TTFT p95 412 ms from the schedule, 105 ms from the
    send`."""
    found = []
    for tier, rows in _tiers(records).items():
        for label, field in VIEWS:
            sent = latencies(rows, field, from_schedule=False)
            due = latencies(rows, field, from_schedule=True)
            worst: tuple[float, str] | None = None
            for q in DIFFER_PERCENTILES:
                at_send, at_due = percentile(sent, q), percentile(due, q)
                if at_send is None or at_due is None:
                    continue
                gap = at_due - at_send
                if gap > max(DIFFER_FLOOR_S, DIFFER_SHARE * at_send) and (
                    worst is None or gap > worst[0]
                ):
                    worst = (
                        gap,
                        f"{tier} {label} p{round(q * 100)} {format_seconds(at_due)} from the "
                        f"schedule, {format_seconds(at_send)} from the send",
                    )
            if worst is not None:
                found.append(worst[1])
    return found


def schedule_table(records: Sequence[Record]) -> Table:
    """Per tier: the send lag and the latencies from the scheduled send."""
    headers = ["tier", "lag p50", "lag p99", "TTFT p50", "TTFT p95", "e2e p50", "e2e p95"]
    table = Table(title="per tier, from the scheduled send (open loop)", title_justify="left")
    for header in headers:
        table.add_column(header, justify="left" if header == "tier" else "right", no_wrap=True)
    for tier, rows in _tiers(records).items():
        lags = np.array([float(r[LAG_FIELD]) for r in rows if r.get(LAG_FIELD) is not None])
        ttft = latencies(rows, "client_ttft_s", from_schedule=True)
        e2e = latencies(rows, "client_e2e_s", from_schedule=True)
        cells = [
            percentile(lags, 0.50),
            percentile(lags, 0.99),
            percentile(ttft, 0.50),
            percentile(ttft, 0.95),
            percentile(e2e, 0.50),
            percentile(e2e, 0.95),
        ]
        table.add_row(tier, *(format_seconds(value) for value in cells))
    return table


def render_schedule(records: Sequence[Record]) -> str:
    """The from-schedule table and a line saying whether the two views differ; "" for a
    closed-loop run (no schedule)."""
    if not has_schedule(records):
        return ""
    buffer = io.StringIO()
    console = Console(file=buffer, width=WIDTH, force_terminal=False, no_color=True)
    console.print(schedule_table(records))
    found = differences(records)
    if found:
        console.print(
            "from the schedule: the client sent late, and the times from the send hide that "
            f"wait (coordinated omission): {'; '.join(found)}. A user arriving on this "
            "schedule waited the from-schedule time; see docs/bench.md."
        )
    else:
        console.print(
            f"from the schedule: within {DIFFER_FLOOR_S * 1e3:g} ms (or {DIFFER_SHARE:.0%}) of "
            "the times from the send at p50, p95 and p99: the client kept its schedule."
        )
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"
