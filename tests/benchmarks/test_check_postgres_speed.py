"""`slo check --db postgresql://...`: the SQL pushdown against today's row-pulling path.

Same records, same run, same `now`: the pushdown (`slo.check.sql_check.evaluate_sql`, what the
command runs) and the row path it replaced (`RecordStore.columns` + `evaluate`), on 1M and 10M
records generated inside PostgreSQL (`pg_records.py`; loaded once into their own schemas and
reused: ten million take a few minutes). Each round checks that both reports are equal, so the
speed is never bought with a different answer. Goal: the pushdown at least 10x faster at 10M.
Both are timed on the same rounds, alternating, and each keeps its best round.

    LLM_SLO_POSTGRES_URL=postgresql+psycopg://... python -m pytest \
        tests/benchmarks/test_check_postgres_speed.py -p no:cacheprovider \
        --benchmark-enable -o addopts='' -s

LLM_SLO_BENCH_PG_SIZES=1000000 limits the sizes. The row path at 10M holds a few GB.
"""

from __future__ import annotations

import os
import time

import pytest

from slo.check.evaluate import columns_needed, evaluate
from slo.check.sql_check import evaluate_sql
from slo.spec import SLOSpec
from slo.store import RecordStore
from tests.benchmarks.pg_records import SPAN_S, START, ensure_records

SIZES = [int(size) for size in
         os.environ.get("LLM_SLO_BENCH_PG_SIZES", "1000000,10000000").split(",")]  # fmt: skip
GOAL_AT_10M = 10.0
SPEC = SLOSpec.default()
NOW = START + SPAN_S  # the records' last day is the window's last day, whenever this runs
RESULTS: dict[int, dict[str, float]] = {}


@pytest.fixture(scope="module")
def base_url() -> str:
    url = os.environ.get("LLM_SLO_POSTGRES_URL")
    if not url:
        pytest.skip("no PostgreSQL: set LLM_SLO_POSTGRES_URL (.ci/run starts one)")
    return url


def pushdown(url: str) -> dict[str, object]:
    store = RecordStore(url)
    try:
        return evaluate_sql(SPEC, store.engine, NOW).to_dict()
    finally:
        store.close()


def row_path(url: str) -> dict[str, object]:
    store = RecordStore(url)
    try:
        columns = store.columns(since=NOW - SPEC.window_s, columns=columns_needed(SPEC))
    finally:
        store.close()
    return evaluate(SPEC, columns, now=NOW).to_dict()


@pytest.mark.parametrize("size", SIZES)
def test_check_postgres_speed(benchmark, base_url: str, size: int) -> None:  # type: ignore[no-untyped-def]
    url = ensure_records(base_url, size)
    rounds = 3 if size <= 1_000_000 else 2  # the best of each: two cores shared with others
    rows_times: list[float] = []
    reports: list[dict[str, object]] = []

    def run_row_path() -> None:  # before each round of ours, untimed by the fixture
        start = time.perf_counter()
        reports.append(row_path(url))
        rows_times.append(time.perf_counter() - start)

    benchmark.group = "check postgresql"
    ours = benchmark.pedantic(
        pushdown, args=(url,), setup=run_row_path, rounds=rounds, iterations=1, warmup_rounds=0
    )
    assert ours == reports[-1], "the pushdown's report differs from the row path's"
    assert all(report == reports[0] for report in reports), "the row path's reports differ"
    ours_s, rows_s = benchmark.stats.stats.min, min(rows_times)
    benchmark.extra_info.update(row_path_s=rows_s, speedup=rows_s / ours_s)
    RESULTS[size] = {"pushdown": ours_s, "rows": rows_s}
    if size >= 10_000_000:
        assert rows_s / ours_s >= GOAL_AT_10M, f"{rows_s / ours_s:.1f}x, goal {GOAL_AT_10M}x"


def test_report_speedups() -> None:
    assert RESULTS, "run the benchmarks first (same session)"
    print("\nrecords       pushdown   row path   speedup")
    for size, times in sorted(RESULTS.items()):
        print(f"{size:>10,} {times['pushdown']:9.2f}s {times['rows']:9.2f}s "
              f"{times['rows'] / times['pushdown']:8.1f}x")  # fmt: skip
