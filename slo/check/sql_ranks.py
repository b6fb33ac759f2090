"""Exact nearest-rank percentiles in PostgreSQL, sorting only the values near each rank.

A percentile is one value at a known rank among a tier's judged values. Sorting every value
to find it is the costly part; here:

1. a small TABLESAMPLE SYSTEM sample (about `SAMPLE_ROWS` rows, a few hundred blocks) says
   roughly where each rank's value lies: per tier and SLI, `bounds` a few sample standard
   errors either side of each target fraction;
2. the counting scan (`slo.check.sql_check`) also counts the judged values between consecutive
   bounds (`TierCounts.regions`), exactly, at the cost of a wider width_bucket array;
3. each rank then falls in one region, known exactly from those counts, and one scan sorts
   only the regions that hold a rank (`percentiles`), each tier and region its own
   `percentile_disc` at the rank within the region.

The sample only decides how much is sorted, never the answer: a rank that falls outside its
expected region (an unlucky sample, a table too small to sample) is found in whichever region
holds it, a wider one. Exactness needs the counts and the sorted values read from the same
rows: `slo.check.sql_check` runs every statement in one REPEATABLE READ transaction.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Connection,
    Double,
    and_,
    case,
    cast,
    false,
    func,
    literal,
    null,
    or_,
    select,
)

from slo.check.sql_counts import (
    CLASSIFY_FIELDS,
    CLASSIFY_TARGET,
    TierCounts,
    fraction_for_rank,
    record_field,
)
from slo.spec import SLOSpec

SAMPLE_ROWS = 40_000  # rows sampled: a few hundred blocks; more would cost more than it saves
SAMPLE_MIN_TABLE = 200_000  # below this a full sort is cheap: no sample, one region
SAMPLE_MIN_VALUES = 1_000  # fewer sampled values of a tier and SLI say too little
# Standard errors of the sample quantile on each side: the rank falls outside its region
# about once in 15 000 for rows in no particular order (more often where a block's rows are
# alike: SYSTEM samples whole blocks); then a wider region is sorted, still exactly.
MARGIN_Z = 4.0

Bounds = tuple[float, ...]  # ascending: region i holds bounds[i-1] <= v < bounds[i]


def targets(spec: SLOSpec, tier_name: str, field_name: str) -> list[float]:
    """The fractions whose nearest rank a tier's report shows for `field_name`."""
    tier = next(t for t in spec.tiers if t.name == tier_name)
    found = [o.target for o in tier.latency_objectives if record_field(o) == field_name]
    if field_name in CLASSIFY_FIELDS:
        found.append(CLASSIFY_TARGET)
    return found


def positions_around(n: int, fractions: Iterable[float]) -> list[int]:
    """0-based positions among `n` sorted sample values a few standard errors either side
    of each fraction (none past either end: the region there is unbounded)."""
    if n < SAMPLE_MIN_VALUES:
        return []
    found: set[int] = set()
    for q in fractions:
        margin = MARGIN_Z * math.sqrt(q * (1 - q) / n) + 2 / n
        if q - margin > 0:
            found.add(min(n - 1, math.floor((q - margin) * n)))
        if q + margin < 1:
            found.add(min(n - 1, math.ceil((q + margin) * n)))
    return sorted(found)


def sample_bounds(
    connection: Connection,
    spec: SLOSpec,
    fields: Sequence[str],
    sampled: Any,  # the table with TABLESAMPLE ... REPEATABLE: the same rows twice
    value: Any,  # (field name, table columns) -> the SLI's value expression
    judged: Any,  # table columns -> the rows a percentile reads
) -> dict[tuple[str, str], Bounds]:
    """Per (tier, field), the bounds around the fractions its report needs.

    Two statements over the same sampled blocks, no value leaves the database: how many
    values each tier and SLI has, then percentile_disc at the positions that says."""
    columns = sampled.c
    where = and_(judged(columns), columns.tier.in_([tier.name for tier in spec.tiers]))
    values = [value(name, columns) for name in fields]
    sizes = select(columns.tier, *[func.count(v) for v in values]).where(where)
    positions: dict[tuple[str, str], list[int]] = {}
    for tier, *counts in connection.execute(sizes.group_by(columns.tier)):
        for name, n in zip(fields, counts, strict=True):
            around = positions_around(n, targets(spec, tier, name))
            if around:
                positions[(tier, name)] = [n, *around]
    if not positions:
        return {}
    aggregates = []
    array: ARRAY[float] = ARRAY(Double())
    for name, v in zip(fields, values, strict=True):
        whens = [
            (
                columns.tier == tier,
                cast(literal([fraction_for_rank(p + 1, at[0]) for p in at[1:]], array), array),
            )
            for (tier, f), at in positions.items()
            if f == name
        ]
        if whens:
            aggregates.append(
                (name, func.percentile_disc(case(*whens, else_=null())).within_group(v))
            )
    statement = (
        select(columns.tier, *[a for _, a in aggregates]).where(where).group_by(columns.tier)
    )
    bounds: dict[tuple[str, str], Bounds] = {}
    for row in connection.execute(statement):
        arrays: Sequence[Any] = row[1:]  # per aggregate: the sampled values, or None
        for (name, _), cuts in zip(aggregates, arrays, strict=True):
            if cuts:
                bounds[(row[0], name)] = tuple(sorted({float(cut) for cut in cuts}))
    return bounds


@dataclass(frozen=True)
class Wanted:
    """Ranks of one SLI in one tier, all in one region: [lower, upper) holds `count` judged
    values and `below` values lie under it (None: unbounded)."""

    ranks: list[int]  # 1-based nearest ranks among all the tier's values
    below: int
    count: int
    lower: float | None = None
    upper: float | None = None

    def fractions(self) -> list[float]:
        return [fraction_for_rank(rank - self.below, self.count) for rank in self.ranks]

    def in_range(self, value: ColumnElement[Any]) -> ColumnElement[bool]:
        tests: list[ColumnElement[bool]] = [value.is_not(None)]
        if self.lower is not None:
            tests.append(value >= literal(self.lower, Double()))
        if self.upper is not None:
            tests.append(value < literal(self.upper, Double()))
        return and_(*tests)


def wanted_regions(
    ranks: Sequence[int], events: int, bounds: Bounds, regions: Mapping[int, int] | None
) -> list[Wanted]:
    """The regions holding `ranks`, from the exact per-region counts; every value in one
    region when the counts do not add up to `events` (no bounds, or none counted)."""
    counts = [(regions or {}).get(index, 0) for index in range(len(bounds) + 1)]
    if sum(counts) != events:
        return [Wanted(list(ranks), 0, events)]
    by_region: dict[int, list[int]] = {}
    cumulative = np.cumsum(counts)
    for rank in ranks:
        by_region.setdefault(bisect_left(cumulative.tolist(), rank), []).append(rank)
    wanted = []
    for index, region_ranks in sorted(by_region.items()):
        below = int(cumulative[index] - counts[index])
        lower = bounds[index - 1] if index > 0 else None
        upper = bounds[index] if index < len(bounds) else None
        wanted.append(Wanted(region_ranks, below, counts[index], lower, upper))
    return wanted


Item = tuple[str, ColumnElement[Any], dict[str, Wanted]]  # field, value, tier: its region


def items_of(
    field_name: str, value: ColumnElement[Any], by_tier: Mapping[str, list[Wanted]]
) -> list[Item]:
    """One item (one ordered-set aggregate) per region a tier needs: the j-th of each tier."""
    depth = max((len(regions) for regions in by_tier.values()), default=0)
    return [
        (field_name, value, {t: regions[j] for t, regions in by_tier.items() if j < len(regions)})
        for j in range(depth)
    ]


def percentiles(
    connection: Connection,
    tier_column: ColumnElement[str],
    where: ColumnElement[bool],
    items: Sequence[Item],
    tiers: dict[str, TierCounts],
) -> None:
    """One scan: per item and tier, percentile_disc over the tier's values in its region
    (one sort serves all its ranks).

    No GROUP BY: each aggregate FILTERs its tier and region, so the workers need not sort
    the rows they keep by tier for the leader to merge."""
    items = [item for item in items if item[2]]
    if not items:
        return
    aggregates, anywhere, wanted = [], [], []
    array: ARRAY[float] = ARRAY(Double())
    for name, value, by_tier in items:
        for tier, w in by_tier.items():
            ordered = func.percentile_disc(cast(literal(w.fractions(), array), array))
            aggregates.append(
                ordered.within_group(value).filter(and_(tier_column == tier, w.in_range(value)))
            )
            wanted.append((name, tier, w.ranks))
        # The WHERE clause tests every row: the item's regions of all tiers as one range, a
        # few comparisons, and the per-tier tests (the FILTER) on the few rows it keeps.
        lowers = [w.lower for w in by_tier.values()]
        uppers = [w.upper for w in by_tier.values()]
        lower = None if None in lowers else min(x for x in lowers if x is not None)
        upper = None if None in uppers else max(x for x in uppers if x is not None)
        anywhere.append(Wanted([], 0, 0, lower, upper).in_range(value))
    # The ranges first: PostgreSQL tests conditions cheapest first, and would test the window
    # and the outcome of every row before the ranges that reject nearly all of them. Wrapped
    # with the ranges, the window costs more than the ranges alone; the ranges alone, a
    # condition of their own, give the planner the number of rows it will read.
    in_ranges = or_(*anywhere)
    statement = select(*aggregates).where(in_ranges, case((in_ranges, where), else_=false()))
    arrays = connection.execute(statement).one()
    for (name, tier, ranks), values in zip(wanted, arrays, strict=True):
        for rank, found in zip(ranks, values or [], strict=True):
            tiers[tier].percentiles[(name, rank)] = float(found)
