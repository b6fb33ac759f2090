"""The evaluator's read of a SQLite record store: one query, straight into numpy arrays.

Python's sqlite3 spends about as much on one column of a row (a type check, an object, a
numpy conversion) as SQLite spends on the whole row, so the read returns as few columns as it
can:

- tier, outcome and output_tokens travel packed in one integer (CASE and bit arithmetic in
  SQL: no strings cross);
- optional columns without a value in any selected row (client timings outside `slo bench`,
  say) are found by a probe, which costs SQLite a scan but Python nothing, and left unread.

Plain SQL on the driver's connection: at ten thousand rows, building the statements with
SQLAlchemy would cost a tenth of the read. Anything else (PostgreSQL, lists of gaps, many
tiers, a value that does not fit) takes the generic read: `coded_columns` returns None.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from sqlalchemy import select

from slo.records import RequestRecord
from slo.sli import OUTCOMES
from slo.store.columns import RecordColumns

TABLE = RequestRecord.__table__  # type: ignore[attr-defined]
# Bits of the packed integer, lowest first: tier, outcome, output_tokens.
_TIER_BITS, _OUTCOME_BITS, _TOKEN_BITS = 6, 3, 40
_UNKNOWN_TIER, _UNKNOWN_OUTCOME = (1 << _TIER_BITS) - 1, (1 << _OUTCOME_BITS) - 1
_TOKENS_SHIFT = _TIER_BITS + _OUTCOME_BITS
# Distinct tiers by hopping along the tier index, one lookup per tier instead of a scan.
_DISTINCT_TIERS = f"""WITH RECURSIVE tiers(name) AS (
    SELECT min(tier) FROM {TABLE.name}
    UNION ALL
    SELECT (SELECT min(tier) FROM {TABLE.name} WHERE tier > tiers.name)
    FROM tiers WHERE tiers.name IS NOT NULL
) SELECT name FROM tiers WHERE name IS NOT NULL"""


def coded_columns(
    names: Sequence[str],
    connect: Callable[[], Any],
    since: float | None = None,
    until: float | None = None,
    tier: str | None = None,
) -> RecordColumns | None:
    """The number columns `names` (no lists) of the records that started in [since, until]
    (the window of `RecordStore.query`), with tier and outcome."""
    conditions = [(since, "timestamp >= ?"), (until, "timestamp <= ?"), (tier, "tier = ?")]
    where = " AND ".join(sql for value, sql in conditions if value is not None)
    where = f" WHERE {where}" if where else ""
    params = [value for value, _ in conditions if value is not None]
    connection = connect()
    try:
        cursor = connection.cursor()
        tiers = [name for (name,) in cursor.execute(_DISTINCT_TIERS)]
        if not tiers or len(tiers) >= _UNKNOWN_TIER or not all(map(_plain_text, tiers)):
            return None  # no rows (the generic read is as quick), or tiers without codes
        nullable = [name for name in names if TABLE.c[name].nullable]
        absent = _absent(cursor, nullable, where, params)
        read = [name for name in names if name not in absent and name != "output_tokens"]
        tokens = "output_tokens" in names
        cursor.execute(
            f"SELECT {_packed_sql(tiers, tokens)}, {', '.join(read)} FROM {TABLE.name}{where}",
            params,
        )
        row_type = np.dtype([("packed", np.int64), *[(name, np.float64) for name in read]])
        table = np.fromiter(cursor, row_type)  # NULL -> NaN
        cursor.close()
    finally:
        connection.close()
    packed = table["packed"]
    tier_codes = packed & _UNKNOWN_TIER
    outcome_codes = (packed >> _TIER_BITS) & _UNKNOWN_OUTCOME
    unknown = (packed < 0) | (tier_codes == _UNKNOWN_TIER) | (outcome_codes == _UNKNOWN_OUTCOME)
    if unknown.any():
        return None  # a tier written since the codes were made, an unknown outcome, odd tokens
    numbers = {name: np.ascontiguousarray(table[name]) for name in read}
    if tokens:
        numbers["output_tokens"] = (packed >> _TOKENS_SHIFT).astype(np.float64)
    return RecordColumns(
        np.array(tiers, dtype=str)[tier_codes],
        np.array(OUTCOMES)[outcome_codes],
        {name: numbers[name] for name in names if name in numbers},
    ).with_missing(absent)


def _plain_text(value: Any) -> bool:
    return isinstance(value, str) and "\0" not in value  # a tier fit for a SQL literal


def _absent(cursor: Any, names: list[str], where: str, params: list[Any]) -> list[str]:
    """Of the nullable columns `names`, those NULL in every selected row. Each probe stops at
    the first row with a value in any column left, so the absent ones cost one scan together."""
    while names:
        any_value = " OR ".join(f"{name} IS NOT NULL" for name in names)
        cursor.execute(
            f"SELECT {', '.join(f'{name} IS NOT NULL' for name in names)} FROM {TABLE.name}"
            f"{where}{' AND' if where else ' WHERE'} ({any_value}) LIMIT 1",
            params,
        )
        found = cursor.fetchone()
        if found is None:
            break
        names = [name for name, has_value in zip(names, found, strict=True) if not has_value]
    return names


def _packed_sql(tiers: list[str], tokens: bool) -> str:
    """The packed integer; negative where output_tokens is not a whole number from 0 to
    2**40 - 1 (`x >> 0 = x` fails for a fraction)."""
    parts = [
        _case("tier", tiers, _UNKNOWN_TIER),
        f"{_case('outcome', OUTCOMES, _UNKNOWN_OUTCOME)} << {_TIER_BITS}",
    ]
    if tokens:
        parts.append(
            f"(CASE WHEN output_tokens >> {_TOKEN_BITS} = 0 AND output_tokens >> 0 = output_tokens"
            f" THEN output_tokens ELSE -1 END) << {_TOKENS_SHIFT}"
        )
    return " | ".join(f"({part})" for part in parts)


def _case(column: str, values: Sequence[str], unknown: int) -> str:
    """CASE column WHEN 'value' THEN code ... ELSE unknown END, the values inline: SQLite runs
    a CASE of bound parameters a third slower per row."""
    whens = " ".join(
        f"WHEN '{value.replace(chr(39), chr(39) * 2)}' THEN {code}"
        for code, value in enumerate(values)
    )
    return f"(CASE {column} {whens} ELSE {unknown} END)"


def stored_keys(engine: Any, keys: Sequence[tuple[Any, Any]]) -> set[tuple[Any, Any]]:
    """Which of these (request id, start time) keys the records table holds: what a replay
    of a spool file skips (`slo.store.replay`). One query on the request id's index."""
    ids = sorted({request_id for request_id, _ in keys})
    if not ids:
        return set()
    statement = select(TABLE.c.request_id, TABLE.c.timestamp).where(TABLE.c.request_id.in_(ids))
    with engine.connect() as connection:
        return {(row[0], row[1]) for row in connection.execute(statement)}
