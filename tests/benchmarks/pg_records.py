"""Synthetic records generated inside PostgreSQL (generate_series), for the check benchmarks.

Each size lives in its own schema (`llm_slo_bench_<size>`) so that the integration tests,
which empty the default table, never touch it, and a loaded table is reused between runs: ten
million rows take minutes to load and only seconds to check.
"""

from __future__ import annotations

from sqlalchemy import Engine, create_engine, text

from slo.store import TABLE, RecordStore
from tests.helpers.postgres import schema_url

START = 1.7e9  # the first record's start; records are spread evenly over one day after it
SPAN_S = 86_400.0

# Lognormal draws by Box-Muller (random_normal() is PostgreSQL 16+); setseed() makes every
# load of a size the same data. 0.5% server errors, 0.1% client errors, 2% one-token replies
# (no TPOT), TTFT ~ 135 ms median, TPOT ~ 30 ms median.
_INSERT = f"""
INSERT INTO {TABLE.name} (request_id, timestamp, tier, model, route, outcome, status_code,
    stream, input_tokens, output_tokens, cached_tokens, e2e_s, ttft_s, tpot_s)
SELECT 'r' || i, :start + i * :step, (ARRAY['premium', 'standard', 'batch'])[1 + (i % 3)],
    'tiny', '/v1/completions',
    CASE WHEN u1 < 0.005 THEN 'server_error' WHEN u1 < 0.006 THEN 'client_error' ELSE 'ok' END,
    200, true, 12, tokens, 0,
    ttft + COALESCE(tpot * (tokens - 1), 0), ttft, tpot
FROM (
    SELECT i, u1, tokens,
        exp(-2.0 + 0.5 * sqrt(-2 * ln(1 - u2)) * cos(2 * pi() * u3)) AS ttft,
        CASE WHEN tokens > 1
             THEN exp(-3.5 + 0.3 * sqrt(-2 * ln(1 - u3)) * sin(2 * pi() * u2)) END AS tpot
    FROM (
        SELECT i, random() AS u1, random() AS u2, random() AS u3,
            CASE WHEN random() < 0.02 THEN 1 ELSE 2 + floor(random() * 198)::int END AS tokens
        FROM generate_series(0, :size - 1) AS i
    ) AS draws
) AS rows
"""


def bench_url(base_url: str, size: int) -> str:
    return schema_url(base_url, f"llm_slo_bench_{size}")


def ensure_records(base_url: str, size: int) -> str:
    """Load `size` records into their own schema unless already there; returns its URL."""
    url = bench_url(base_url, size)
    engine: Engine = create_engine(base_url)
    try:
        with engine.begin() as connection:
            connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS llm_slo_bench_{size}"))
    finally:
        engine.dispose()
    store = RecordStore(url)  # our table and indexes in that schema
    try:
        with store.engine.begin() as connection:
            count = connection.execute(text(f"SELECT count(*) FROM {TABLE.name}")).scalar_one()
            loaded = count != size
            if loaded:
                connection.execute(text(f"TRUNCATE {TABLE.name}"))
                connection.execute(text("SELECT setseed(0.25)"))
                connection.execute(
                    text(_INSERT), {"start": START, "step": SPAN_S / size, "size": size}
                )
        if loaded:  # fresh statistics, and a visibility map for index-only scans
            with store.engine.connect() as connection:
                connection.execution_options(isolation_level="AUTOCOMMIT").execute(
                    text(f"VACUUM ANALYZE {TABLE.name}")
                )
    finally:
        store.close()
    return url
