"""`slo check --db postgresql://...`: PostgreSQL counts, Python judges.

Pulling ten million rows into Python costs minutes and gigabytes; the evaluator only needs,
per tier and alert window, how many events each objective has and how many are good, plus a
few nearest-rank percentiles. Those are aggregates a database computes where the rows are:

1. a small sample says where each percentile's value roughly lies (`slo.check.sql_ranks`);
2. one parallel scan, GROUP BY one packed integer (`slo.check.sql_scan`): the window
   bucket, per SLI the value's interval among its thresholds and the sampled bounds
   (width_bucket: one binary search per value), the client-view flags, the tier and the
   outcome. A few thousand groups hold every count: events per SLI, good events per
   threshold, availability and goodput populations, client-view rows, the throughput span
   and the judged values per sampled region;
3. one scan sorting only the regions that hold a rank: `percentile_disc(fractions) WITHIN
   GROUP (ORDER BY value)`, each fraction the exact nearest rank `evaluate` takes within the
   region (`fraction_for_rank`);
4. ITL, where a tier has an ITL objective: counts and percentiles over the gaps, unnested in
   SQL from the JSON list column (`slo.check.sql_gaps`; no row leaves the database).

Every value is a bound parameter (SQLAlchemy Core); tier names come back as data. Semantics
follow `evaluate` to the count: latency events are ok requests with a value (the client view
where it has one: COALESCE), availability is ok over all but client_error and cancelled,
goodput ANDs every per-request latency objective of the tier
(`slo.arithmetic.goodput_checks`). "v <= T" is "v < nextafter(T)" for doubles, exactly.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, and_, func, literal, text
from sqlalchemy.exc import SQLAlchemyError

from slo.check.evaluate import EvaluationReport
from slo.check.sql_counts import CountPlan, TierCounts, build_report, events_key, percentile_ranks
from slo.check.sql_gaps import count_gaps, gap_percentiles, gap_rows
from slo.check.sql_ranks import (
    SAMPLE_MIN_TABLE,
    SAMPLE_ROWS,
    Bounds,
    Wanted,
    items_of,
    percentiles,
    sample_bounds,
    wanted_regions,
)
from slo.check.sql_scan import Scan, sli_value
from slo.errors import UsageError
from slo.spec import SLOSpec
from slo.store import TABLE

_C = TABLE.c
_SETTINGS = ("SET LOCAL work_mem = '64MB'",)  # the percentile sorts stay in memory
# On a large table the scans are CPU-bound on evaluating expressions: JIT-compiled and
# optimised expressions and tuple deforming take about a third off, for a few hundred
# milliseconds of compiling per process (a loss at 1M rows, measured). Inlining
# PostgreSQL's functions doubles that compiling for no measurable gain.
JIT_MIN_TABLE = 4_000_000
_JIT = (
    "jit = on",
    "jit_above_cost = 0",
    "jit_inline_above_cost = -1",
    "jit_optimize_above_cost = 0",
)


def evaluate_sql(spec: SLOSpec, engine: Engine, now: float) -> EvaluationReport:
    """The report `evaluate(spec, columns, now)` gives on the records of [now - window, now]."""
    plan = CountPlan.of(spec)
    windows = spec.alert_policy.windows_s
    since = now - spec.window_s
    tiers: dict[str, TierCounts] = {}
    try:
        with engine.connect() as connection:
            # One snapshot for every statement: the percentile scan must read the very rows
            # the counting scan counted, whatever is written meanwhile.
            connection.execution_options(isolation_level="REPEATABLE READ")
            with connection.begin():
                rows = _table_rows(connection)
                for setting in _SETTINGS:
                    connection.execute(text(setting))
                connection.execute(text("SET LOCAL jit = off"))  # on for the scans below
                bounds = _bounds(connection, spec, plan, since, now, rows)
                for setting in _JIT if rows >= JIT_MIN_TABLE else ():
                    connection.execute(text(f"SET LOCAL {setting}"))
                scan = Scan(plan, [tier.name for tier in spec.tiers], since, now, windows, bounds)
                client_rows = scan.count(connection, tiers)
                _request_percentiles(connection, spec, plan, since, now, bounds, tiers, scan.absent)
                if plan.gap_tiers:
                    gaps = gap_rows(plan, since, now, windows, tiers)
                    count_gaps(connection, plan, gaps, tiers, len(windows) + 1)
                    gap_percentiles(connection, spec, gaps, tiers)
    except SQLAlchemyError as error:
        where = engine.url.render_as_string(hide_password=True)
        raise UsageError(
            f"cannot read records from {where}: {str(error).splitlines()[0]}"
        ) from None
    return build_report(spec, now, tiers, client_rows)


# --- the rows, as the evaluator sees them ---------------------------------------------------


def _judged(since: float, now: float, columns: Any = _C) -> ColumnElement[bool]:
    """Rows a percentile reads: ok, in the window, not after now."""
    stamp = columns.timestamp
    return and_(stamp >= since, stamp <= now, columns.outcome == "ok")


def _table_rows(connection: Connection) -> float:
    """The planner's row count of the records table (search_path decides which): enough to
    size the sample and choose JIT; 0 where never analysed."""
    found = connection.execute(
        text("SELECT reltuples FROM pg_class WHERE oid = to_regclass(:name)"), {"name": TABLE.name}
    ).scalar()
    return max(float(found or 0.0), 0.0)


def _bounds(
    connection: Connection, spec: SLOSpec, plan: CountPlan, since: float, now: float, rows: float
) -> dict[tuple[str, str], Bounds]:
    if rows < SAMPLE_MIN_TABLE or not plan.fields:
        return {}
    percent = min(100.0, 100.0 * SAMPLE_ROWS / rows)
    # A fixed seed: the same blocks every run, so the same work (never a different answer).
    sampled = TABLE.tablesample(func.system(percent), name="sampled", seed=literal(0.0))
    return sample_bounds(
        connection,
        spec,
        plan.fields,
        sampled,
        sli_value,
        lambda columns: _judged(since, now, columns),
    )


# --- step 3: nearest-rank percentiles -----------------------------------------------------


def _request_percentiles(
    connection: Connection,
    spec: SLOSpec,
    plan: CountPlan,
    since: float,
    now: float,
    bounds: dict[tuple[str, str], Bounds],
    tiers: dict[str, TierCounts],
    absent: Container[str],
) -> None:
    """The percentiles from the counted regions. A client column the counting scan found
    NULL in every row is NULL in every row read here (one snapshot): reading the server's
    column alone spares deforming the last columns of every row."""
    items = []
    for name in plan.fields:
        by_tier: dict[str, list[Wanted]] = {}
        for tier in spec.tiers:
            counts = tiers.get(tier.name)
            events = counts.total(events_key(name)) if counts else 0
            ranks = percentile_ranks(tier, name, events)
            if counts and ranks:
                cuts = bounds.get((tier.name, name), ())
                by_tier[tier.name] = wanted_regions(ranks, events, cuts, counts.regions.get(name))
        items += items_of(name, sli_value(name, _C, absent), by_tier)
    percentiles(connection, _C.tier, _judged(since, now), items, tiers)
