"""The record store against a real PostgreSQL (`.ci/run` starts one and sets the URL)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from slo.errors import UsageError
from slo.records import record_from_dict
from slo.store import TABLE, RecordStore
from tests.conftest import require_or_skip
from tests.helpers.record_samples import sample_records
from tests.helpers.store_round_trip import check_round_trip

pytestmark = pytest.mark.integration


@pytest.fixture
def postgres_store() -> Iterator[RecordStore]:
    url = os.environ.get("LLM_SLO_POSTGRES_URL")
    if not url:
        require_or_skip("no PostgreSQL: set LLM_SLO_POSTGRES_URL (.ci/run starts one)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        require_or_skip("psycopg is not installed (pip install 'llm-slo[postgres]')")
    try:
        store = RecordStore(url)
    except UsageError as error:  # unreachable server: say why, then skip or fail
        require_or_skip(f"PostgreSQL at {url} is not reachable: {error}")
    # Each test gets an empty table; the shared database may hold other runs' rows.
    with store.engine.begin() as connection:
        connection.execute(text(f"TRUNCATE {TABLE.name}"))
    yield store
    with store.engine.begin() as connection:
        connection.execute(text(f"TRUNCATE {TABLE.name}"))
    store.close()


def test_postgres_round_trips_100k_records(postgres_store: RecordStore, tmp_path: Path) -> None:
    check_round_trip(postgres_store, tmp_path, 100_000)
    assert postgres_store.engine.dialect.name == "postgresql"


def test_postgres_background_writer(postgres_store: RecordStore) -> None:
    records = [record_from_dict(r | {"request_id": str(uuid.uuid4())}) for r in sample_records(300)]
    for record in records:
        postgres_store.add(record)
    postgres_store.flush()
    assert postgres_store.written == 300
    assert len(postgres_store.query(tier="standard")) == 100
