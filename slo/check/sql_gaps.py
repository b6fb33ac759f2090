"""ITL for `slo check --db postgresql://...`: one event per inter-token gap, unnested in SQL.

A tier with an ITL objective is judged on every gap of every ok request: the client's list
in a tier that has any (as `evaluate`: then the whole tier is judged on the client view),
else the server's. `json_array_elements_text` unnests the JSON list column inside
PostgreSQL, the gaps are counted per tier and window bucket, and their percentiles found
with `percentile_disc` (`slo.check.sql_ranks.percentiles`); no row leaves the database.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Double,
    case,
    cast,
    func,
    literal,
    null,
    select,
    true,
)
from sqlalchemy.sql.selectable import Subquery

from slo.check.sql_counts import (
    FUTURE_BUCKET,
    ITL_FIELD,
    Condition,
    CountPlan,
    TierCounts,
    gap_key,
    percentile_ranks,
)
from slo.check.sql_ranks import Wanted, items_of, percentiles
from slo.spec import SLOSpec
from slo.store import TABLE

_C = TABLE.c


def json_array(column: ColumnElement[Any]) -> ColumnElement[Any]:
    """The column where it holds a JSON array, NULL elsewhere (a scalar has no elements)."""
    return case((func.json_typeof(column) == "array", column), else_=null())


def good(value: ColumnElement[Any], test: Condition) -> ColumnElement[bool]:
    """Whether a gap passes the test ("v <= T" or "v < T")."""
    _, threshold, inclusive = test
    bound: ColumnElement[float] = literal(threshold, Double())
    return value <= bound if inclusive else value < bound


def gap_rows(
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
    elements = func.json_array_elements_text(json_array(column)).table_valued("value").lateral()
    stamp = _C.timestamp
    whens = [(stamp >= now - window, index) for index, window in enumerate(windows)]
    bucket = case((stamp > now, FUTURE_BUCKET), *whens, else_=len(windows))
    return (
        select(
            _C.tier.label("tier"),
            bucket.label("bucket"),
            cast(elements.c.value, Double()).label("gap"),
        )
        .select_from(TABLE.join(elements, true()))
        .where(stamp >= since, _C.outcome == "ok", _C.tier.in_(plan.gap_tiers))
        .subquery("gaps")
    )


def count_gaps(
    connection: Connection,
    plan: CountPlan,
    gaps: Subquery,
    tiers: dict[str, TierCounts],
    buckets: int,
) -> None:
    g = gaps.c
    aggregates: dict[str, ColumnElement[Any]] = {gap_key(None): func.count()}
    for test in plan.gap_conditions:
        aggregates[gap_key(test)] = func.count().filter(good(g.gap, test))
    statement = select(g.tier, g.bucket, *aggregates.values()).group_by(g.tier, g.bucket)
    for tier, bucket, *values in connection.execute(statement):
        counts = tiers.setdefault(tier, TierCounts(buckets))
        if bucket != FUTURE_BUCKET:
            for key, value in zip(aggregates, values, strict=True):
                counts.add(key, bucket, value)


def gap_percentiles(
    connection: Connection, spec: SLOSpec, gaps: Subquery, tiers: dict[str, TierCounts]
) -> None:
    by_tier: dict[str, list[Wanted]] = {}
    for tier in spec.tiers:
        events = tiers[tier.name].total(gap_key(None)) if tier.name in tiers else 0
        ranks = percentile_ranks(tier, ITL_FIELD, events)
        if ranks:
            by_tier[tier.name] = [Wanted(ranks, 0, events)]  # every gap: no regions counted
    g = gaps.c
    where = g.bucket != FUTURE_BUCKET
    percentiles(connection, g.tier, where, items_of(ITL_FIELD, g.gap, by_tier), tiers)
