"""`slo bench --runs N`: each percentile over N runs, with a 95% confidence interval.

One run's p95 is one draw: another seed, another minute of the server, and it moves. Run i
(from 1) plans its requests from seed + i - 1, so run 1 is the single run `--seed` gives, and
the runs differ as two runs of the same workload do. For each tier and percentile the runs
give N values x_1..x_N (each run's own nearest-rank percentile, as its summary would print):

- mean and a 95% t-interval of the mean: mean +- t(0.975, N - 1) * s / sqrt(N), with s the
  sample standard deviation over runs (the low end clipped at 0). It says where the percentile
  of this workload lies, and narrows as runs are added. It treats the runs as independent
  draws from one distribution: true of separate seeds against a server in a steady state, not
  of a server that warms up.
- the range, min to max over the runs: where each run's own value lies. With more than a few
  runs some runs fall outside the t-interval; that is the run-to-run spread, not an error.

A run without a value (no ok request of the tier) is left out of that percentile, whose row
says how many runs it holds; one value has no interval.
"""

from __future__ import annotations

import io
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from slo.check.summary import TierSummary, columns_of, summarize
from slo.cli.bench.schedule import has_schedule, latencies, percentile
from slo.cli.bench.summary import WIDTH, format_seconds
from slo.spec import SLOSpec

if TYPE_CHECKING:
    from slo.cli.bench.runner import RunResult

CONFIDENCE = 0.95
Record = Mapping[str, Any]


@lru_cache(maxsize=64)
def t_critical(df: int, confidence: float = CONFIDENCE) -> float:
    """The two-sided Student t critical value: P(|T| <= t) = confidence with `df` degrees of
    freedom. By bisection on the t distribution's CDF, its density integrated by Simpson's
    rule (no SciPy at run time; the tests hold it against `scipy.stats.t`)."""
    if df < 1:
        raise ValueError(f"t_critical: df must be >= 1, got {df}")
    scale = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def density(x: float) -> float:
        return scale * (1 + x * x / df) ** (-(df + 1) / 2)

    def central(t: float, steps: int = 2000) -> float:  # P(|T| <= t), steps even
        h = t / steps
        inner = sum((4 if k % 2 else 2) * density(k * h) for k in range(1, steps))
        return 2 * h / 3 * (density(0.0) + inner + density(t))

    low, high = 0.0, 1.0
    while central(high) < confidence:
        high *= 2
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if central(middle) < confidence else (low, middle)
    return (low + high) / 2


@dataclass(frozen=True)
class Spread:
    """One tier's percentile over the runs that had it."""

    tier: str
    name: str  # "TTFT p95", "e2e p95 from schedule", ...
    values: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def interval(self) -> tuple[float, float] | None:
        """The 95% t-interval of the mean; None with fewer than two values."""
        if len(self.values) < 2:
            return None
        half = t_critical(len(self.values) - 1) * statistics.stdev(self.values)
        half /= math.sqrt(len(self.values))
        return max(0.0, self.mean - half), self.mean + half  # no latency is negative


Measure = Callable[[Sequence[Record], TierSummary], float | None]


def _from_schedule(field: str, q: float) -> Measure:
    def measure(rows: Sequence[Record], summary: TierSummary) -> float | None:
        tier = [row for row in rows if row.get("tier") == summary.tier]
        return percentile(latencies(tier, field, from_schedule=True), q)

    return measure


# The percentiles of the summary's table, then the two from the schedule (open loop only).
MEASURES: tuple[tuple[str, Measure], ...] = (
    ("TTFT p50", lambda rows, summary: summary.ttft_p50_s),
    ("TTFT p95", lambda rows, summary: summary.ttft_p95_s),
    ("TPOT p95", lambda rows, summary: summary.tpot_p95_s),
    ("e2e p95", lambda rows, summary: summary.e2e_p95_s),
)
SCHEDULE_MEASURES: tuple[tuple[str, Measure], ...] = (
    ("TTFT p95 from schedule", _from_schedule("client_ttft_s", 0.95)),
    ("e2e p95 from schedule", _from_schedule("client_e2e_s", 0.95)),
)


def spreads(spec: SLOSpec, runs: Sequence[Sequence[Record]]) -> list[Spread]:
    """Per tier (the spec's order) and percentile: each run's value, over the runs."""
    measures = MEASURES + (SCHEDULE_MEASURES if any(has_schedule(r) for r in runs) else ())
    values: dict[tuple[str, str], list[float]] = {}
    for rows in runs:
        if not rows:
            continue
        for summary in summarize(spec, columns_of(rows)):
            for name, measure in measures:
                value = measure(rows, summary)
                values.setdefault((summary.tier, name), [])
                if value is not None:
                    values[(summary.tier, name)].append(value)
    return [Spread(tier, name, tuple(found)) for (tier, name), found in values.items() if found]


def runs_table(found: Sequence[Spread], runs: int) -> Table:
    title = f"per tier over {runs} runs: mean, {CONFIDENCE:.0%} t-interval of the mean, range"
    table = Table(title=title, title_justify="left")
    for header in ("tier", "percentile", "runs", "mean", "95% interval", "min", "max"):
        left = header in ("tier", "percentile")
        table.add_column(header, justify="left" if left else "right", no_wrap=True)
    for spread in found:
        interval = spread.interval
        shown = "-" if interval is None else " - ".join(format_seconds(v) for v in interval)
        table.add_row(
            spread.tier,
            spread.name,
            str(len(spread.values)),
            format_seconds(spread.mean),
            shown,
            format_seconds(min(spread.values)),
            format_seconds(max(spread.values)),
        )
    return table


def render_runs(spec: SLOSpec, runs: Sequence[Sequence[Record]]) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=WIDTH, force_terminal=False, no_color=True)
    console.print(runs_table(spreads(spec, runs), len(runs)))
    console.print(
        "Each run's percentile is one value; the interval is where their mean lies (95%, "
        "Student t over the runs), the range where each run's own value fell. docs/bench.md."
    )
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


def print_summary(spec: SLOSpec, results: Sequence[RunResult]) -> None:
    """What `slo bench` prints after its runs: the summary of every record, each objective with
    a failure a miss, the view from the schedule (open loop) and, over several runs, each
    percentile's interval."""
    import sys

    from slo.cli.bench.schedule import render_schedule
    from slo.cli.bench.summary import render_summary
    from slo.cli.bench.verdicts import render_objectives

    records = [record for result in results for record in result.records]
    if not records:
        return
    columns = columns_of(records)
    sys.stdout.write(render_summary(spec, columns, sum(r.elapsed_s for r in results)))
    sys.stdout.write(render_objectives(spec, columns))
    sys.stdout.write(render_schedule(records))
    if len(results) > 1:
        sys.stdout.write(render_runs(spec, [result.records for result in results]))
