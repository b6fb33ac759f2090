"""`slo check --db postgresql://...`: PostgreSQL counts, Python judges.

Pulling ten million rows into Python costs minutes and gigabytes; the evaluator only needs,
per tier and alert window, how many events each objective has and how many are good, plus a
few nearest-rank percentiles. Those are aggregates a database computes where the rows are:

1. a small sample says where each percentile's value roughly lies (`slo.check.sql_ranks`);
2. one parallel scan, GROUP BY one packed integer (`_Scan`): the window bucket, per SLI the
   value's interval among its thresholds and the sampled bounds (width_bucket: one binary
   search per value), the client-view flags, the tier and the outcome. A few thousand
   groups hold every count: events per SLI, good events per threshold, availability and
   goodput populations, client-view rows, the throughput span and the judged values per
   sampled region;
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

import math
from bisect import bisect_right
from collections.abc import Container, Sequence
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
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
    select,
    text,
)
from sqlalchemy.exc import SQLAlchemyError

from slo.check.evaluate import CLIENT_VIEW, EvaluationReport
from slo.check.sql_counts import (
    FUTURE_BUCKET,
    Condition,
    CountPlan,
    Group,
    TierCounts,
    add_group,
    build_report,
    events_key,
    percentile_ranks,
)
from slo.check.sql_gaps import count_gaps, gap_percentiles, gap_rows, json_array
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
from slo.errors import UsageError
from slo.sli import OUTCOMES, OUTCOMES_EXCLUDED_FROM_AVAILABILITY
from slo.spec import SLOSpec
from slo.store import TABLE

_C = TABLE.c
# The scan's tier digit names the spec's tiers; every other tier is counted under this key
# (not a tier name a record can hold), then told apart by `_Scan._others`.
_OTHERS = "\x00others"
# An outcome per outcome digit: `add_group` tells only ok and excluded from availability.
_OTHER_OUTCOME = next(o for o in OUTCOMES if o not in ("ok", *OUTCOMES_EXCLUDED_FROM_AVAILABILITY))
_OUTCOME_OF = ("ok", OUTCOMES_EXCLUDED_FROM_AVAILABILITY[0], _OTHER_OUTCOME)
_SETTINGS = ("SET LOCAL work_mem = '64MB'",)  # the percentile sorts stay in memory
# On a large table the scans are CPU-bound on evaluating expressions: JIT-compiled and
# optimised expressions and tuple deforming take about a third off, for a few hundred
# milliseconds of compiling per process (a loss at 1M rows, measured). Inlining
# PostgreSQL's functions doubles that compiling for no measurable gain.
JIT_MIN_TABLE = 4_000_000
INT4_KEYS = 2**31 - 1  # packed keys up to this many fit an integer
_JIT = ("jit = on", "jit_above_cost = 0", "jit_inline_above_cost = -1",
        "jit_optimize_above_cost = 0")  # fmt: skip


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
                scan = _Scan(plan, [tier.name for tier in spec.tiers], since, now, windows, bounds)
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


def _value(name: str, columns: Any = _C, absent: Container[str] = ()) -> ColumnElement[Any]:
    """An SLI's value: the client view where the record has one (what the person waiting saw),
    the server's alone where the client column is known `absent` from every row read.

    Stored NaN would count as a value here but as missing in numpy; records are validated
    (finite or absent) before they are written, so none are stored."""
    client = CLIENT_VIEW.get(name)
    if client is None or client in absent:
        return columns[name]  # type: ignore[no-any-return]
    return func.coalesce(columns[client], columns[name])


def _judged(since: float, now: float, columns: Any = _C) -> ColumnElement[bool]:
    """Rows a percentile reads: ok, in the window, not after now."""
    stamp = columns.timestamp
    return and_(stamp >= since, stamp <= now, columns.outcome == "ok")


def _upper(test: Condition) -> float:
    """The edge below which a value passes the test: "v <= T" is "v < nextafter(T)"."""
    _, threshold, inclusive = test
    return math.nextafter(threshold, math.inf) if inclusive else threshold


def _doubles(values: Sequence[float]) -> ColumnElement[Any]:
    return literal(list(values), ARRAY(Double()))


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
    return sample_bounds(connection, spec, plan.fields, sampled, _value,
                         lambda columns: _judged(since, now, columns))  # fmt: skip


class _Scan:
    """Step 2: one scan, GROUP BY tier, outcome and a packed key of small integers ("digits").

    Digit 0 is the window bucket: width_bucket over [now - longest window, ..., now - shortest,
    nextafter(now)]. Then one digit per SLI: the value's interval in an ascending array of
    its threshold edges (`_upper`) and, for a tier with sampled bounds, those bounds too
    (NULL: the last interval + 1); the level (first test passed) and the region are both
    read back from the interval. Then a 0/1 digit per client-view column, whether the
    record has client gaps when an ITL objective needs it, the tier (its index in the spec,
    one more for any other) and the outcome (ok, excluded from availability, other): small
    integers hash and compare for less than the strings.
    """

    def __init__(
        self,
        plan: CountPlan,
        tier_names: Sequence[str],
        since: float,
        now: float,
        windows: Sequence[float],
        bounds: dict[tuple[str, str], Bounds],
    ):
        self.plan, self.bounds, self.windows = plan, bounds, windows
        self.tier_names = list(tier_names)
        self.since, self.now = since, now
        self.client_names = sorted(
            {"client_ttft_s", "client_e2e_s"} | {CLIENT_VIEW[name] for name in plan.client_fields}
        )
        self.edges = {name: [_upper(test) for test in plan.chains[name]] for name in plan.fields}
        # field: the ascending array its values are placed in: its threshold edges and every
        # tier's sampled bounds (one array for all tiers: no per-row test of the tier)
        sampled = [(field, cut) for (_, field), cuts in bounds.items() for cut in cuts]
        self.arrays = {
            name: sorted({*self.edges[name], *(cut for field, cut in sampled if field == name)})
            for name in plan.fields
        }
        self.digits: list[tuple[ColumnElement[int], int]] = []
        stamps = [now - window for window in reversed(windows)]
        stamps.append(math.nextafter(now, math.inf))
        self.digits.append((func.width_bucket(_C.timestamp, _doubles(stamps)), len(stamps) + 1))
        for name in plan.fields:
            self.digits.append(self._interval(name))
        for name in self.client_names:
            self.digits.append((cast(_C[name].is_not(None), Integer), 2))
        if plan.gap_tiers:
            client_gaps = json_array(_C.client_itl_s)
            has_gaps = case((client_gaps.is_(None), false()),
                            else_=func.json_array_length(client_gaps) > 0)  # fmt: skip
            self.digits.append((cast(has_gaps, Integer), 2))
        tier_index = case({name: index for index, name in enumerate(self.tier_names)},
                          value=_C.tier, else_=len(self.tier_names))  # fmt: skip
        self.digits.append((tier_index, len(self.tier_names) + 1))
        excluded = _C.outcome.in_(OUTCOMES_EXCLUDED_FROM_AVAILABILITY)
        outcome = case((_C.outcome == "ok", 0), (excluded, 1), else_=2)
        self.digits.append((outcome, 3))
        self.keys = math.prod(size for _, size in self.digits)
        self._decoded: dict[tuple[str, str, int], tuple[int | None, int]] = {}
        self.absent: set[str] = set()  # client columns NULL in every row counted

    def _interval(self, name: str) -> tuple[ColumnElement[int], int]:
        array = self.arrays[name]
        placed = func.width_bucket(_value(name), _doubles(array))
        return func.coalesce(placed, len(array) + 1), len(array) + 2

    def count(self, connection: Connection, tiers: dict[str, TierCounts]) -> int:
        """Every count, into `tiers`; returns the records with a client view."""
        wide = self.keys > INT4_KEYS  # int4 arithmetic would overflow: pack in bigint
        packed, radix = None, 1
        for digit, size in self.digits:
            term = cast(digit, BigInteger) if wide else digit
            term = term * literal(radix, BigInteger if wide else Integer) if radix > 1 else term
            packed = term if packed is None else packed + term
            radix *= size
        assert packed is not None
        # OFFSET NULL keeps the subquery a subquery (not merged into the outer query) and
        # still parallel: the planner has no statistics on its column k, takes it for at
        # most 200 values, and aggregates in each worker. Merged, the key is an expression
        # over a timestamp and latencies, taken for as many groups as rows: the planner
        # would sort ten million rows, or hash them on one core.
        rows = (
            select(packed.label("k"), _C.output_tokens, _C.timestamp,
                   (_C.timestamp + _C.e2e_s).label("end"))
            .where(_C.timestamp >= self.since)
            .offset(null())
            .subquery("requests")
        )  # fmt: skip
        r = rows.c
        statement = select(
            r.k, func.count(), func.sum(r.output_tokens), func.min(r.timestamp), func.max(r.end)
        ).group_by(r.k)
        found = []
        for k, *rest in connection.execute(statement):
            digits = self._unpack(k)
            tier = self.tier_names[digits[-2]] if digits[-2] < len(self.tier_names) else _OTHERS
            found.append((tier, _OUTCOME_OF[digits[-1]], digits[:-2], rest))
        client_rows = self._add(found, tiers)
        if _OTHERS in tiers:  # records of tiers the spec does not define: each one's count
            self._others(connection, tiers)
        return client_rows

    def _others(self, connection: Connection, tiers: dict[str, TierCounts]) -> None:
        """Each undefined tier's records in the window and after now, for the report's note
        (one more scan, only when there are any)."""
        del tiers[_OTHERS]
        stamp, now = _C.timestamp, self.now
        statement = (
            select(_C.tier, func.count().filter(stamp <= now), func.count().filter(stamp > now))
            .where(stamp >= self.since, _C.tier.not_in(self.tier_names))
            .group_by(_C.tier)
        )
        for tier, in_window, future in connection.execute(statement):
            counts = tiers.setdefault(tier, TierCounts(len(self.windows) + 1))
            counts.add("records", 0, in_window)
            counts.future += future

    def _unpack(self, key: int) -> tuple[int, ...]:
        digits = []
        for _, size in self.digits:
            key, digit = divmod(key, size)
            digits.append(digit)
        return tuple(digits)

    def _decode(self, tier: str, name: str, interval: int) -> tuple[int | None, int]:
        """(level, region) of a value in `interval` of the tier's array (level None: no value)."""
        key = (tier, name, interval)
        if key not in self._decoded:
            array = self.arrays[name]
            if interval > len(array):
                self._decoded[key] = (None, 0)
            elif interval == 0:
                self._decoded[key] = (0, 0)
            else:
                floor = array[interval - 1]
                region = bisect_right(self.bounds.get((tier, name), ()), floor)
                self._decoded[key] = (bisect_right(self.edges[name], floor), region)
        return self._decoded[key]

    def _add(self, rows: Sequence[tuple[str, str, tuple[int, ...], Sequence[Any]]],
             tiers: dict[str, TierCounts]) -> int:  # fmt: skip
        """Groups alike in every level are summed first: the sampled bounds split groups that
        `add_group` counts as one."""
        plan, fields, clients = self.plan, len(self.plan.fields), len(self.client_names)
        buckets = len(self.windows) + 1
        merged: dict[tuple[Any, ...], list[Any]] = {}
        for tier, outcome, digits, (n, tokens, start, end) in rows:
            bucket = len(self.windows) - digits[0]  # the last interval: after now (-1)
            decoded = [self._decode(tier, name, digits[1 + index])
                       for index, name in enumerate(plan.fields)]  # fmt: skip
            rest = digits[1 + fields :]
            key = (tier, outcome, bucket, tuple(level for level, _ in decoded), rest)
            if key not in merged:
                merged[key] = [0, 0, None, None]
            total = merged[key]
            total[0] += n
            total[1] += int(tokens or 0)
            total[2] = start if total[2] is None else min(total[2], start)
            total[3] = end if total[3] is None else max(total[3], end)
            if outcome == "ok" and bucket != FUTURE_BUCKET:
                counts = tiers.setdefault(tier, TierCounts(buckets))
                for name, (level, region) in zip(plan.fields, decoded, strict=True):
                    if level is not None:
                        regions = counts.regions.setdefault(name, {})
                        regions[region] = regions.get(region, 0) + n
        client_rows = 0
        seen: set[str] = set()  # client columns with a value in some row
        for (tier, outcome, bucket, levels, rest), (n, tokens, start, end) in merged.items():
            client = dict(zip(self.client_names, map(bool, rest[:clients]), strict=True))
            seen.update(name for name, present in client.items() if present)
            group = Group(
                bucket=bucket,
                outcome=outcome,
                levels=dict(zip(plan.fields, levels, strict=True)),
                client=client,
                client_gaps=bool(rest[clients]) if plan.gap_tiers else False,
                n=n,
                tokens=tokens,
                start=start,
                end=end,
            )
            client_rows += add_group(plan, group, tiers.setdefault(tier, TierCounts(buckets)))
        self.absent = set(self.client_names) - seen
        for counts in tiers.values():
            counts.client_gaps = counts.total("client_gaps") > 0
        return client_rows


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
        items += items_of(name, _value(name, _C, absent), by_tier)
    percentiles(connection, _C.tier, _judged(since, now), items, tiers)
