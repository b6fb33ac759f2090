"""`slo check --db postgresql://...`: PostgreSQL counts, Python judges.

Pulling ten million rows into Python costs minutes and gigabytes; the evaluator only needs,
per tier and alert window, how many events each objective has and how many are good, plus a
few nearest-rank percentiles. Those are aggregates a database computes where the rows are:

1. one scan, GROUP BY tier and window bucket (`slo.sql_counts`), one `COUNT(*) FILTER (WHERE
   ...)` per thing counted: events per SLI, good events per distinct threshold, availability
   and goodput populations, client-view rows, and the throughput span;
2. one scan for the percentiles: `percentile_disc(fractions) WITHIN GROUP (ORDER BY value)`,
   one sort per tier and SLI, the fractions chosen from step 1's counts so that each is the
   exact nearest rank `evaluate` takes (`fraction_for_rank`);
3. ITL, where a tier has an ITL objective: the same two steps over the gaps, unnested in SQL
   from the JSON list column with `json_array_elements_text` (no row leaves the database).

Every value is a bound parameter (SQLAlchemy Core); tier names come back as data. Semantics
follow `evaluate` to the count: latency events are ok requests with a value (the client view
where it has one: COALESCE), NaN counts as missing (NULLIF), availability is ok over all but
client_error and cancelled, goodput ANDs every per-request latency objective of the tier
(`slo.arithmetic.goodput_checks`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Connection,
    Double,
    Engine,
    Integer,
    and_,
    case,
    cast,
    false,
    func,
    literal,
    null,
    or_,
    select,
    text,
    true,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.sql.selectable import Subquery

from slo.errors import UsageError
from slo.evaluate import CLIENT_VIEW, EvaluationReport
from slo.spec import SLOSpec
from slo.sql_counts import (
    FUTURE_BUCKET,
    ITL_FIELD,
    Condition,
    CountPlan,
    Group,
    TierCounts,
    add_group,
    build_report,
    chain,
    events_key,
    fraction_for_rank,
    gap_key,
    percentile_ranks,
)
from slo.store import TABLE

_C = TABLE.c
# Local to the transaction. The planner takes each grouping key for as many groups as
# timestamps (it cannot see that a CASE has a handful of values) and would sort ten million
# rows to group them: hashing is what a few hundred groups want. JIT compiling costs seconds
# of a query that runs seconds. The percentile sorts stay in memory.
_SETTINGS = (
    "SET LOCAL enable_sort = off",
    "SET LOCAL enable_incremental_sort = off",
    "SET LOCAL jit = off",
    "SET LOCAL work_mem = '64MB'",
)
# Histogram bins for the percentiles: 50 per decade from 1 us to 100 000 s (each bin spans
# 4.7%), so that a percentile sorts one bin's values, not all of them.
_EDGES: tuple[float, ...] = tuple(float(f"{10 ** (e / 50):.6g}") for e in range(-300, 251))


def evaluate_sql(spec: SLOSpec, engine: Engine, now: float) -> EvaluationReport:
    """The report `evaluate(spec, columns, now)` gives on the records of [now - window, now]."""
    plan = CountPlan.of(spec)
    windows = spec.alert_policy.windows_s
    since = now - spec.window_s
    tiers: dict[str, TierCounts] = {}
    try:
        with engine.connect() as connection, connection.begin():
            for setting in _SETTINGS:
                connection.execute(text(setting))
            levels = _Levels(plan, since, now, windows)
            client_rows = levels.count(connection, tiers)
            _request_percentiles(connection, spec, plan, levels, tiers)
            if plan.gap_tiers:
                gaps = _gaps(plan, since, now, windows, tiers)
                _count_gaps(connection, plan, gaps, tiers, len(windows) + 1)
                _gap_percentiles(connection, spec, gaps, tiers)
    except SQLAlchemyError as error:
        where = engine.url.render_as_string(hide_password=True)
        raise UsageError(
            f"cannot read records from {where}: {str(error).splitlines()[0]}"
        ) from None
    return build_report(spec, now, tiers, client_rows)


# --- the rows, as the evaluator sees them ---------------------------------------------------


def _value(name: str) -> ColumnElement[Any]:
    """An SLI's value: the client view where the record has one (what the person waiting saw).

    Stored NaN would count as a value here but as missing in numpy; records are validated
    (finite or absent) before they are written, so none are stored."""
    client = CLIENT_VIEW.get(name)
    if client is None:
        return _C[name]
    return func.coalesce(_C[client], _C[name])


def _bucket(since: float, now: float, windows: Sequence[float]) -> ColumnElement[int]:
    timestamp = _C.timestamp
    whens = [(timestamp >= now - window, index) for index, window in enumerate(windows)]
    return case((timestamp > now, FUTURE_BUCKET), *whens, else_=len(windows))


def _json_array(column: ColumnElement[Any]) -> ColumnElement[Any]:
    """The column where it holds a JSON array, NULL elsewhere (a scalar has no elements)."""
    return case((func.json_typeof(column) == "array", column), else_=null())


def _test(value: ColumnElement[Any], test: Condition) -> ColumnElement[bool]:
    _, threshold, inclusive = test
    bound: ColumnElement[float] = literal(threshold, Double())
    return value <= bound if inclusive else value < bound


def _level(value: ColumnElement[Any], tests: Sequence[Condition]) -> ColumnElement[Any]:
    """NULL without a value, else the index of the first test of the chain it passes
    (len(tests): none); test j holds exactly where level <= j."""
    whens = [(_test(value, test), index) for index, test in enumerate(tests)]
    return case((value.is_(None), null()), *whens, else_=len(tests))


class _Levels:
    """Step 1: one scan, GROUP BY what decides every count, COUNT(*) per group.

    Instead of one COUNT(*) FILTER per threshold (each a test on every row), each SLI value
    becomes its level in its chain of thresholds, and the rows are grouped by tier, window
    bucket, outcome, levels and client-view flags: a few hundred groups, from which every
    objective's events and good events per window are sums. The same scan, as grouping
    sets, counts each SLI's values per histogram bin (`_EDGES`) for step 2.
    """

    def __init__(self, plan: CountPlan, since: float, now: float, windows: Sequence[float]):
        self.plan, self.buckets = plan, len(windows) + 1
        self.chains = {name: chain(plan.conditions, name) for name in plan.fields}
        self.client_names = sorted({"client_ttft_s", "client_e2e_s"}
                                   | {CLIENT_VIEW[name] for name in plan.client_fields})  # fmt: skip
        self.since, self.now, self.windows = since, now, windows
        self.edges: ColumnElement[Any] = literal(list(_EDGES), ARRAY(Double()))

    def where(self) -> ColumnElement[bool]:
        return _C.timestamp >= self.since

    def judged(self) -> ColumnElement[bool]:
        """Rows a percentile reads: ok, in the window, not after now."""
        return and_(_C.outcome == "ok", _C.timestamp <= self.now)

    def count(self, connection: Connection, tiers: dict[str, TierCounts]) -> int:
        plan = self.plan
        keys: list[ColumnElement[Any]] = [
            _C.tier, _bucket(self.since, self.now, self.windows), _C.outcome,
            *[_level(_value(name), self.chains[name]) for name in plan.fields],
            *[_C[name].is_not(None) for name in self.client_names],
        ]  # fmt: skip
        if plan.gap_tiers:
            client_gaps = _json_array(_C.client_itl_s)
            has_gaps = case(
                (client_gaps.is_(None), false()), else_=func.json_array_length(client_gaps) > 0
            )
            keys.append(has_gaps)
        # Grouped through a subquery: GROUP BY then names its columns, and PostgreSQL matches
        # them with the SELECT list (the same expression twice would hold different
        # parameters, $1 and $9, and not match).
        names = [f"k{i}" for i in range(len(keys))]
        bin_names = [f"bin_{name}" for name in plan.fields]
        ok = _C.outcome == "ok"
        rows = (
            select(
                *[key.label(name) for key, name in zip(keys, names, strict=True)],
                self.judged().label("judged"),
                *[
                    func.width_bucket(_value(name), self.edges).label(label)
                    for name, label in zip(plan.fields, bin_names, strict=True)
                ],
                ok.label("ok"),
                _C.output_tokens.label("tokens"),
                _C.timestamp.label("start"),
                (_C.timestamp + _C.e2e_s).label("end"),
            )
            .where(self.where())
            .subquery("requests")
        )
        r = rows.c
        group = [r[name] for name in names]
        bins = [r[name] for name in bin_names]
        statement = select(
            *group, func.count(), func.sum(r.tokens).filter(r.ok),
            func.min(r.start).filter(r.ok), func.max(r.end).filter(r.ok),
        ).group_by(*group)  # fmt: skip
        client_rows = sum(self._add_group(row, tiers) for row in connection.execute(statement))
        if bins:
            self._histograms(connection, rows, bins, tiers)
        for counts in tiers.values():
            counts.client_gaps = counts.total("client_gaps") > 0
        return client_rows

    def _histograms(
        self,
        connection: Connection,
        rows: Subquery,
        bins: Sequence[ColumnElement[Any]],
        tiers: dict[str, TierCounts],
    ) -> None:
        """Per tier and SLI, the judged values per histogram bin, in one pass: each row is
        unpivoted into one (field, bin) pair per SLI (unnest of two arrays), so one hash
        table serves every SLI and the planner, without statistics on the pairs, hashes."""
        r = rows.c
        fields = list(range(len(bins)))
        pairs = (
            func.unnest(literal(fields, ARRAY(Integer())), postgresql.array(bins))
            .table_valued("field", "bin")
            .render_derived(name="pairs")  # a function in FROM sees the row: implicitly LATERAL
        )
        histogram = (
            select(r.k0, pairs.c.field, pairs.c.bin, func.count())
            .select_from(rows.join(pairs, true()))
            .where(r.judged)
            .group_by(r.k0, pairs.c.field, pairs.c.bin)
        )
        for tier, index, number, n in connection.execute(histogram):
            counts = tiers.setdefault(tier, TierCounts(self.buckets))
            counts.bins.setdefault(self.plan.fields[index], {})[number] = n

    def _add_group(self, values: Sequence[Any], tiers: dict[str, TierCounts]) -> int:
        fields, clients = len(self.plan.fields), len(self.client_names)
        rest = values[3 + fields + clients :]  # the gaps flag (if counted), n, tokens, span
        n, tokens, start, end = rest[-4:]
        group = Group(
            bucket=values[1],
            outcome=values[2],
            levels=dict(zip(self.plan.fields, values[3 : 3 + fields], strict=True)),
            client=dict(zip(self.client_names, values[3 + fields : -len(rest)], strict=True)),
            client_gaps=bool(rest[0]) if self.plan.gap_tiers else False,
            n=n,
            tokens=tokens,
            start=start,
            end=end,
        )
        return add_group(self.plan, group, tiers.setdefault(values[0], TierCounts(self.buckets)))


# --- step 2: nearest-rank percentiles -----------------------------------------------------


@dataclass(frozen=True)
class _Wanted:
    """The ranks of one SLI in one tier, and the value range (bins) that holds them."""

    ranks: list[int]  # 1-based nearest ranks among all `events` values
    events: int
    below: int = 0  # values under `lower`: ranks inside the range are `rank - below`
    inside: int = 0  # values in [lower, upper); 0: no range, every value
    lower: float | None = None
    upper: float | None = None

    def fractions(self) -> list[float]:
        if not self.inside:
            return [fraction_for_rank(rank, self.events) for rank in self.ranks]
        return [fraction_for_rank(rank - self.below, self.inside) for rank in self.ranks]

    def in_range(self, value: ColumnElement[Any]) -> ColumnElement[bool]:
        tests: list[ColumnElement[bool]] = [value.is_not(None)]
        if self.lower is not None:
            tests.append(value >= literal(self.lower, Double()))
        if self.upper is not None:
            tests.append(value < literal(self.upper, Double()))
        return and_(*tests)


def _narrowed(ranks: list[int], events: int, bins: dict[int, int] | None) -> _Wanted:
    """The bins (width_bucket numbers: bin b holds EDGES[b-1] <= v < EDGES[b]) that hold the
    ranks, from the per-bin counts; every value when the counts do not add up."""
    counts = sorted((b, n) for b, n in (bins or {}).items() if b is not None)
    if sum(n for _, n in counts) != events:
        return _Wanted(ranks, events)
    cumulative, first, last, below = 0, None, None, 0
    for number, n in counts:
        if first is None and cumulative + n >= ranks[0]:
            first, below = number, cumulative
        cumulative += n
        if cumulative >= ranks[-1]:
            last = number
            break
    assert first is not None and last is not None
    inside = sum(n for number, n in counts if first <= number <= last)
    lower = _EDGES[first - 1] if first > 0 else None
    upper = _EDGES[last] if last < len(_EDGES) else None
    return _Wanted(ranks, events, below, inside, lower, upper)


def _percentiles(
    connection: Connection,
    tier_column: ColumnElement[str],
    where: ColumnElement[bool],
    wanted: dict[str, tuple[ColumnElement[Any], dict[str, _Wanted]]],  # field: value, tiers
    tiers: dict[str, TierCounts],
) -> None:
    """One scan: per field, percentile_disc over each tier's values in its range.

    percentile_disc's direct argument may use the grouped column: each tier (group) gets its
    own fractions, one sort per tier and field serves all its ranks."""
    wanted = {name: item for name, item in wanted.items() if item[1]}
    if not wanted:
        return
    aggregates, anywhere = [], []
    for value, by_tier in wanted.values():
        array: ARRAY[float] = ARRAY(Double())
        fractions = case(*[(tier_column == tier, cast(literal(w.fractions(), array), array))
                           for tier, w in by_tier.items()], else_=null())  # fmt: skip
        ranges = [(tier_column == tier, w.in_range(value)) for tier, w in by_tier.items()]
        anywhere += [and_(*pair) for pair in ranges]
        ordered = func.percentile_disc(fractions).within_group(value)
        aggregates.append(ordered.filter(case(*ranges, else_=false())))
    statement = select(tier_column, *aggregates).where(where, or_(*anywhere)).group_by(tier_column)
    # The rows in range are few: sorting them beats walking the tier index over the table.
    connection.execute(text("SET LOCAL enable_sort = on"))
    for tier_name, *arrays in connection.execute(statement):
        for (name, (_, by_tier)), values in zip(wanted.items(), arrays, strict=True):
            ranks = by_tier[tier_name].ranks if tier_name in by_tier else []
            for rank, value in zip(ranks, values or [], strict=True):
                tiers[tier_name].percentiles[(name, rank)] = float(value)


def _request_percentiles(
    connection: Connection,
    spec: SLOSpec,
    plan: CountPlan,
    levels: _Levels,
    tiers: dict[str, TierCounts],
) -> None:
    wanted: dict[str, tuple[ColumnElement[Any], dict[str, _Wanted]]] = {}
    for name in plan.fields:
        by_tier = {}
        for tier in spec.tiers:
            counts = tiers.get(tier.name)
            events = counts.total(events_key(name)) if counts else 0
            ranks = percentile_ranks(tier, name, events)
            if counts and ranks:
                by_tier[tier.name] = _narrowed(ranks, events, counts.bins.get(name))
        wanted[name] = (_value(name), by_tier)
    where = and_(levels.where(), levels.judged())
    _percentiles(connection, _C.tier, where, wanted, tiers)


# --- ITL: one event per gap, unnested in SQL ------------------------------------------------


def _gaps(
    plan: CountPlan,
    since: float,
    now: float,
    windows: Sequence[float],
    tiers: dict[str, TierCounts],
) -> Subquery:
    """Every gap of every ok request of the ITL tiers: the client's list in a tier that has
    any (as `evaluate`: then the whole tier is judged on the client view), else the server's."""
    client_tiers = [name for name in plan.gap_tiers if name in tiers and tiers[name].client_gaps]
    column: ColumnElement[Any] = _C.itl_s
    if client_tiers:
        column = case((_C.tier.in_(client_tiers), _C.client_itl_s), else_=_C.itl_s)
    elements = func.json_array_elements_text(_json_array(column)).table_valued("value").lateral()
    return (
        select(
            _C.tier.label("tier"),
            _bucket(since, now, windows).label("bucket"),
            cast(elements.c.value, Double()).label("gap"),
        )
        .select_from(TABLE.join(elements, true()))
        .where(_C.timestamp >= since, _C.outcome == "ok", _C.tier.in_(plan.gap_tiers))
        .subquery("gaps")
    )


def _count_gaps(
    connection: Connection,
    plan: CountPlan,
    gaps: Subquery,
    tiers: dict[str, TierCounts],
    buckets: int,
) -> None:
    g = gaps.c
    aggregates: dict[str, ColumnElement[Any]] = {gap_key(None): func.count()}
    for test in plan.gap_conditions:
        aggregates[gap_key(test)] = func.count().filter(_test(g.gap, test))
    statement = select(g.tier, g.bucket, *aggregates.values()).group_by(g.tier, g.bucket)
    for tier, bucket, *values in connection.execute(statement):
        counts = tiers.setdefault(tier, TierCounts(buckets))
        if bucket != FUTURE_BUCKET:
            for key, value in zip(aggregates, values, strict=True):
                counts.add(key, bucket, value)


def _gap_percentiles(
    connection: Connection, spec: SLOSpec, gaps: Subquery, tiers: dict[str, TierCounts]
) -> None:
    by_tier: dict[str, _Wanted] = {}
    for tier in spec.tiers:
        events = tiers[tier.name].total(gap_key(None)) if tier.name in tiers else 0
        ranks = percentile_ranks(tier, ITL_FIELD, events)
        if ranks:
            by_tier[tier.name] = _Wanted(ranks, events)  # every gap: no bins counted
    g = gaps.c
    where = g.bucket != FUTURE_BUCKET
    _percentiles(connection, g.tier, where, {ITL_FIELD: (g.gap, by_tier)}, tiers)
