"""`slo check --results RUN.JSONL` counted in DuckDB: the file is parsed and counted in C++,
on every core, and Python only judges the counts.

The evaluator needs, per tier and alert window, how many events each objective has and how
many are good, plus a few nearest-rank percentiles: the same counts `slo check --db` asks of
PostgreSQL (`slo.check.sql_counts`: `CountPlan` says what to count, `add_group` and `build_report`
turn the counts into the very report `slo.check.evaluate.evaluate` makes). Here:

1. DuckDB's `read_json` parses the needed fields of every line, as JSON values, into a
   temporary table, with a `clean` flag per row: each value has the JSON type the record
   format asks for (a string, a number, a whole number for token counts) and a value the
   reference reader accepts (finite, not negative; NaN only comes from a `NaN` literal);
2. one GROUP BY tier, window bucket, outcome and, per SLI, the level of its value in the
   chain of thresholds (`slo.check.sql_counts.chain`): a few hundred groups hold every count;
3. one scan for `quantile_disc` at fractions chosen from step 2's counts, so that each is the
   exact nearest rank `evaluate` takes (`fraction_for_rank`; DuckDB, like PostgreSQL, takes
   the value at position ceil(f * n)).

DuckDB reads numbers leniently (a string "1.5" or true into a DOUBLE): the fields are read
as JSON so that their types can be checked. Anything the fast path cannot vouch for (a
line DuckDB rejects, a value of the wrong type, an ITL objective, whose gaps are lists)
returns None, and `slo check` takes the reference reader (`slo.store.columns.load_jsonl_columns`),
which gives today's report or today's one-line error naming file:line. Two leniencies of
DuckDB's parser are not seen: a trailing comma before `}` and a JSON null where outcome or a
token count may be left out (read as left out).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb

from slo.check.evaluate import CLIENT_VIEW, EvaluationReport, columns_needed
from slo.check.sql_counts import (
    FUTURE_BUCKET,
    Condition,
    CountPlan,
    Group,
    TierCounts,
    add_group,
    build_report,
    chain,
    events_key,
    fraction_for_rank,
    percentile_ranks,
)
from slo.sli import OUTCOMES
from slo.spec import SLOSpec

# The record format's types (slo.records holds the same lists, but importing it loads sqlmodel
# and SQLAlchemy, a quarter of a second; a unit test keeps the two equal).
REQUIRED_NUMBERS = ("timestamp", "e2e_s")
WHOLE_NUMBERS = ("status_code", "input_tokens", "output_tokens", "cached_tokens")
_WHOLE_TYPES = "('UBIGINT', 'BIGINT')"


def evaluate_jsonl(spec: SLOSpec, path: str | Path) -> EvaluationReport | None:
    """The report `evaluate(spec, load_jsonl_columns(path))` gives, or None where only the
    reference reader can say (bad or unusual input, ITL objectives, an empty file)."""
    plan = CountPlan.of(spec)
    if plan.gap_tiers or any(char in str(path) for char in "*?[{"):
        return None  # ITL gaps are lists; DuckDB would read those characters as a glob
    numbers = sorted(columns_needed(spec) - {"itl_s", "client_itl_s"})
    connection = duckdb.connect()
    try:
        connection.execute(_load_sql(Path(path), numbers))
        clean, rows, now = connection.execute(
            "SELECT bool_and(clean), count(*), max(timestamp + e2e_s) FROM records"
        ).fetchone() or (None, 0, None)
        if not clean or not rows:
            return None
        now = float(now)
        tiers: dict[str, TierCounts] = {}
        client_rows = _count(connection, spec, plan, now, tiers)
        _percentiles(connection, spec, plan, now, tiers)
    except duckdb.Error:
        return None  # the reference reader names the line (or reads what DuckDB would not)
    finally:
        connection.close()
    return build_report(spec, now, tiers, client_rows)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _load_sql(path: Path, numbers: Sequence[str]) -> str:
    """The needed fields of every line, typed, and whether the line is clean.

    A JSON column holds each value's JSON text, so its first character tells its type
    cheaply: '"' a string, a digit or '-' a number (NaN and Infinity literals fail or are not
    finite). Numbers are read back from that text (the shortest text that round-trips)."""
    fields = ["request_id", "tier", "outcome", *numbers]
    columns = "{" + ", ".join(f"{_literal(name)}: 'JSON'" for name in fields) + "}"
    outcomes = ", ".join(map(_literal, OUTCOMES))
    checks = [
        "ascii(request_id) = 34",
        "ascii(tier) = 34",
        f"(outcome IS NULL OR (ascii(outcome) = 34 AND {_text('outcome')} IN ({outcomes})))",
    ]
    values = []
    for name in numbers:
        if name in WHOLE_NUMBERS:
            value = f"coalesce({name}::VARCHAR::BIGINT, 0)"
            check = f"json_type({name}) IN {_WHOLE_TYPES} AND {value} >= 0"
        else:
            value = f"{name}::VARCHAR::DOUBLE"
            check = f"(ascii({name}) BETWEEN 48 AND 57 OR ascii({name}) = 45) AND isfinite({value})"
            if name != "timestamp":
                check += f" AND {value} >= 0"
        present = name in REQUIRED_NUMBERS
        checks.append(f"({check})" if present else f"({name} IS NULL OR ({check}))")
        values.append(f"{value} AS {name}")
    clean = " AND ".join(f"coalesce({check}, false)" for check in checks)
    return (
        f"CREATE TEMP TABLE records AS SELECT {_text('tier')} AS tier, "
        f"coalesce({_text('outcome')}, 'ok') AS outcome, {', '.join(values)}, {clean} AS clean "
        f"FROM read_json({_literal(str(path))}, format = 'newline_delimited', "
        f"columns = {columns})"
    )


def _text(name: str) -> str:
    """A JSON string's text: between the quotes unless it has escapes (parsed then)."""
    return f"CASE WHEN contains({name}, '\\') THEN {name}->>'$' ELSE {name}[2:-2] END"


def _value(name: str, names: Sequence[str]) -> str:
    """An SLI's value: the client view where the record has one (as `evaluate`)."""
    client = CLIENT_VIEW.get(name)
    return f"coalesce({client}, {name})" if client in names else name


def _test(value: str, test: Condition, params: list[Any]) -> str:
    params.append(test[1])
    return f"{value} <= ?" if test[2] else f"{value} < ?"


def _count(
    connection: duckdb.DuckDBPyConnection,
    spec: SLOSpec,
    plan: CountPlan,
    now: float,
    tiers: dict[str, TierCounts],
) -> int:
    """Step 2: every count, grouped by what decides it; returns the client-view records."""
    windows = spec.alert_policy.windows_s
    names = sorted(columns_needed(spec))
    client_names = sorted(
        {"client_ttft_s", "client_e2e_s"} | {CLIENT_VIEW[name] for name in plan.client_fields}
    )
    params: list[Any] = [now, now - spec.window_s]  # the bounds `evaluate` computes
    whens = []
    for index, window in enumerate(windows):
        whens.append(f"WHEN timestamp >= ? THEN {index}")
        params.append(now - window)
    bucket = (
        f"CASE WHEN timestamp > ? OR timestamp < ? THEN {FUTURE_BUCKET} {' '.join(whens)} "
        f"ELSE {len(windows)} END"
    )
    levels = []
    for name in plan.fields:
        value = _value(name, names)
        tests = chain(plan.conditions, name)
        steps = " ".join(
            f"WHEN {_test(value, test, params)} THEN {index}" for index, test in enumerate(tests)
        )
        levels.append(f"CASE WHEN {value} IS NULL THEN NULL {steps} ELSE {len(tests)} END")
    flags = [f"{name} IS NOT NULL" for name in client_names]
    keys = ["tier", bucket, "outcome", *levels, *flags]
    ok = "FILTER (WHERE outcome = 'ok')"
    statement = (
        f"SELECT {', '.join(keys)}, count(*), sum(output_tokens) {ok}, min(timestamp) {ok}, "
        f"max(timestamp + e2e_s) {ok} FROM records GROUP BY ALL"
    )
    buckets = len(windows) + 1
    fields, clients = len(plan.fields), len(client_names)
    client_rows = 0
    for row in connection.execute(statement, params).fetchall():
        n, tokens, start, end = row[-4:]
        group = Group(
            bucket=row[1],
            outcome=row[2],
            levels=dict(zip(plan.fields, row[3 : 3 + fields], strict=True)),
            client=dict(zip(client_names, row[3 + fields : 3 + fields + clients], strict=True)),
            client_gaps=False,
            n=n,
            tokens=tokens,
            start=start,
            end=end,
        )
        client_rows += add_group(plan, group, tiers.setdefault(row[0], TierCounts(buckets)))
    return client_rows


def _percentiles(
    connection: duckdb.DuckDBPyConnection,
    spec: SLOSpec,
    plan: CountPlan,
    now: float,
    tiers: dict[str, TierCounts],
) -> None:
    """Step 3: one scan, one `quantile_disc` per tier and SLI at the exact nearest ranks."""
    names = sorted(columns_needed(spec))
    aggregates, wanted = [], []
    for name in plan.fields:
        for tier in spec.tiers:
            counts = tiers.get(tier.name)
            events = counts.total(events_key(name)) if counts else 0
            ranks = percentile_ranks(tier, name, events)
            if not ranks:
                continue
            # Text cast to DOUBLE: a decimal literal would be a DECIMAL, rounded on the way.
            fractions = ", ".join(f"'{fraction_for_rank(r, events)!r}'::DOUBLE" for r in ranks)
            aggregates.append(
                f"quantile_disc({_value(name, names)}, [{fractions}]) "
                f"FILTER (WHERE tier = {_literal(tier.name)})"
            )
            wanted.append((tier.name, name, ranks))
    if not aggregates:
        return
    judged = "outcome = 'ok' AND timestamp >= ? AND timestamp <= ?"
    statement = f"SELECT {', '.join(aggregates)} FROM records WHERE {judged}"
    found = connection.execute(statement, [now - spec.window_s, now]).fetchone() or ()
    for (tier_name, name, ranks), values in zip(wanted, found, strict=True):
        for rank, value in zip(ranks, values, strict=True):
            assert value is not None and not math.isnan(value)
            tiers[tier_name].percentiles[(name, rank)] = float(value)
