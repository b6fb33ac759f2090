"""Step 2 of `slo check --db postgresql://...` (`slo.check.sql_check`): one parallel scan,
GROUP BY one packed integer, that holds every count the evaluator needs."""

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
    Integer,
    case,
    cast,
    false,
    func,
    literal,
    null,
    select,
)

from slo.check.evaluate import CLIENT_VIEW
from slo.check.sql_counts import FUTURE_BUCKET, Condition, CountPlan, Group, TierCounts, add_group
from slo.check.sql_gaps import json_array
from slo.check.sql_ranks import Bounds
from slo.sli import OUTCOMES, OUTCOMES_EXCLUDED_FROM_AVAILABILITY
from slo.store import TABLE

_C = TABLE.c
# The scan's tier digit names the spec's tiers; every other tier is counted under this key
# (not a tier name a record can hold), then told apart by `Scan._others`.
_OTHERS = "\x00others"
# An outcome per outcome digit: `add_group` tells only ok and excluded from availability.
_OTHER_OUTCOME = next(o for o in OUTCOMES if o not in ("ok", *OUTCOMES_EXCLUDED_FROM_AVAILABILITY))
_OUTCOME_OF = ("ok", OUTCOMES_EXCLUDED_FROM_AVAILABILITY[0], _OTHER_OUTCOME)
INT4_KEYS = 2**31 - 1  # packed keys up to this many fit an integer


def sli_value(name: str, columns: Any = _C, absent: Container[str] = ()) -> ColumnElement[Any]:
    """An SLI's value: the client view where the record has one (what the person waiting saw),
    the server's alone where the client column is known `absent` from every row read.

    Stored NaN would count as a value here but as missing in numpy; records are validated
    (finite or absent) before they are written, so none are stored."""
    client = CLIENT_VIEW.get(name)
    if client is None or client in absent:
        return columns[name]  # type: ignore[no-any-return]
    return func.coalesce(columns[client], columns[name])


def _upper(test: Condition) -> float:
    """The edge below which a value passes the test: "v <= T" is "v < nextafter(T)"."""
    _, threshold, inclusive = test
    return math.nextafter(threshold, math.inf) if inclusive else threshold


def _doubles(values: Sequence[float]) -> ColumnElement[Any]:
    return literal(list(values), ARRAY(Double()))


class Scan:
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
            has_gaps = case(
                (client_gaps.is_(None), false()), else_=func.json_array_length(client_gaps) > 0
            )
            self.digits.append((cast(has_gaps, Integer), 2))
        tier_index = case(
            {name: index for index, name in enumerate(self.tier_names)},
            value=_C.tier,
            else_=len(self.tier_names),
        )
        self.digits.append((tier_index, len(self.tier_names) + 1))
        excluded = _C.outcome.in_(OUTCOMES_EXCLUDED_FROM_AVAILABILITY)
        outcome = case((_C.outcome == "ok", 0), (excluded, 1), else_=2)
        self.digits.append((outcome, 3))
        self.keys = math.prod(size for _, size in self.digits)
        self._decoded: dict[tuple[str, str, int], tuple[int | None, int]] = {}
        self.absent: set[str] = set()  # client columns NULL in every row counted

    def _interval(self, name: str) -> tuple[ColumnElement[int], int]:
        array = self.arrays[name]
        placed = func.width_bucket(sli_value(name), _doubles(array))
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
            select(
                packed.label("k"),
                _C.output_tokens,
                _C.timestamp,
                (_C.timestamp + _C.e2e_s).label("end"),
            )
            .where(_C.timestamp >= self.since)
            .offset(null())
            .subquery("requests")
        )
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

    def _add(
        self,
        rows: Sequence[tuple[str, str, tuple[int, ...], Sequence[Any]]],
        tiers: dict[str, TierCounts],
    ) -> int:
        """Groups alike in every level are summed first: the sampled bounds split groups that
        `add_group` counts as one."""
        plan, fields, clients = self.plan, len(self.plan.fields), len(self.client_names)
        buckets = len(self.windows) + 1
        merged: dict[tuple[Any, ...], list[Any]] = {}
        for tier, outcome, digits, (n, tokens, start, end) in rows:
            bucket = len(self.windows) - digits[0]  # the last interval: after now (-1)
            decoded = [
                self._decode(tier, name, digits[1 + index])
                for index, name in enumerate(plan.fields)
            ]
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
