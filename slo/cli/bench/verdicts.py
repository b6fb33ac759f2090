"""The table of each per-request objective `slo bench` prints: attainment and verdict with every
failed request a miss (`slo.check.misses`), as the capacity search judges a step."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from slo.check.evaluate import ObjectiveResult
from slo.check.misses import evaluate_counting_failures, failed
from slo.cli.bench.summary import WIDTH, format_seconds
from slo.spec import SLOSpec
from slo.store.columns import RecordColumns

JUDGED_KINDS = ("latency", "availability", "goodput")


def _observed(result: ObjectiveResult) -> str:
    """The percentile the objective names; "a failure" where its rank fell on one."""
    objective = result.objective
    if objective.kind != "latency" or objective.form != "percentile" or not result.events:
        return "-"
    return "a failure" if result.observed_s is None else format_seconds(result.observed_s)


def objectives_table(spec: SLOSpec, columns: RecordColumns) -> Table:
    report = evaluate_counting_failures(spec, columns)
    headers = ["tier", "objective", "events", "failed", "attainment", "observed", "verdict"]
    table = Table(title="objectives, a failed request a miss", title_justify="left")
    for header in headers:
        left = header in ("tier", "objective", "verdict")
        table.add_column(header, justify="left" if left else "right", no_wrap=header != "objective")
    misses = failed(columns)
    for tier in report.tiers:
        if not tier.requests:
            continue
        failures = str(int((misses & (columns.tier == tier.name)).sum()))
        for result in tier.objectives:
            if result.objective.kind not in JUDGED_KINDS:
                continue
            attainment = result.attainment
            table.add_row(
                tier.name,
                result.objective.name,
                str(result.events),
                failures,
                "-" if attainment is None else f"{attainment:.1%}",
                _observed(result),
                result.verdict,
            )
    return table


def render_objectives(spec: SLOSpec, columns: RecordColumns) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=WIDTH, force_terminal=False, no_color=True)
    console.print(objectives_table(spec, columns))
    console.print(
        "A request that failed (server error, timeout, shed, rate limited) missed every "
        "objective of its tier: it is an event of each, never good. `slo check --results` "
        "judges latency over the answered requests and counts failures under availability."
    )
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"
