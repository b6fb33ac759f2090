"""Record store faults: a locked database, a closed store mid-outage, a broken spool, bad rows.

The outage is real: a second SQLite connection holds the write lock (`BEGIN EXCLUSIVE`), as a
backup or a migration would; the store's connections time out after 0.2 s instead of 5 s.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from slo.records import read_jsonl
from slo.store import RecordStore
from tests.helpers.polling import wait_until
from tests.helpers.record_samples import sample_records

BUSY_TIMEOUT = "?timeout=0.2"


def stored_ids(path: Path) -> list[str]:
    with sqlite3.connect(path) as connection:
        return [
            row[0] for row in connection.execute("SELECT request_id FROM llm_slo_request_records")
        ]


def spool_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("llm-slo-spool-*"))


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "records.db"
    RecordStore(path).close()  # create the table (and WAL mode) before anything locks it
    return path


@pytest.fixture
def lock(db: Path) -> Iterator[sqlite3.Connection]:
    """Another connection holding the write lock until the test commits it."""
    connection = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    connection.execute("BEGIN EXCLUSIVE")
    yield connection
    if connection.in_transaction:
        connection.execute("COMMIT")
    connection.close()


def open_store(db: Path, **options: float | int | Path) -> RecordStore:
    settings: dict[str, float | int | Path] = {
        "queue_size": 50, "batch_size": 20, "flush_interval_s": 0.05, "max_retry_s": 0.2,
    }  # fmt: skip
    return RecordStore(f"sqlite:///{db}{BUSY_TIMEOUT}", **(settings | options))  # type: ignore[arg-type]


def test_locked_database_spools_then_replays_every_record(
    db: Path, lock: sqlite3.Connection
) -> None:
    records = sample_records(300)
    store = open_store(db)
    for record in records:
        store.add(record)  # the queue holds 50; the rest must go to the spool, not be dropped
    store.flush()  # during the outage: returns once everything is in the spool
    assert store.written == 0 and store.dropped == 0
    assert store.spooled == 300
    assert len(spool_files(db.parent)) == 1

    lock.execute("COMMIT")  # the database is back
    wait_until(lambda: store.replayed == 300, 30.0, "the spool to be replayed")
    store.close()

    assert (store.written, store.spooled, store.replayed, store.dropped) == (300, 300, 300, 0)
    assert sorted(stored_ids(db)) == sorted(r["request_id"] for r in records)  # none twice
    assert spool_files(db.parent) == []


def test_short_outage_is_held_in_memory(db: Path, lock: sqlite3.Connection) -> None:
    store = open_store(db, queue_size=1000)
    for record in sample_records(100):
        store.add(record)
    wait_until(lambda: not store.writer.healthy, 30.0, "the writer to notice the lock")
    lock.execute("COMMIT")
    wait_until(lambda: store.written == 100, 30.0, "the buffered records to be written")
    store.close()
    # Only the batch whose write failed went to the spool; the rest waited in memory.
    assert 0 < store.spooled <= 20 and store.replayed == store.spooled and store.dropped == 0
    assert len(stored_ids(db)) == 100


def test_close_during_outage_keeps_records_for_the_next_store(
    db: Path, lock: sqlite3.Connection
) -> None:
    records = sample_records(120, seed=1)
    store = open_store(db)
    for record in records:
        store.add(record)
    store.close()  # returns although the database is still locked
    assert (store.written, store.spooled, store.dropped) == (0, 120, 0)
    (left,) = spool_files(db.parent)
    # The spool is a records JSONL file: `slo check --results` and import_jsonl read it.
    assert sorted(r.request_id for r in read_jsonl(left)) == sorted(
        r["request_id"] for r in records
    )

    lock.execute("COMMIT")
    with open_store(db.parent / "another.db") as other:  # same directory, another database
        assert other.replayed == 0
    assert spool_files(db.parent) == [left]  # a spool is only ever replayed into its own
    with open_store(db) as next_store:  # adopts the orphaned file and replays it
        wait_until(lambda: next_store.replayed == 120, 30.0, "the orphaned spool to be replayed")
    assert sorted(stored_ids(db)) == sorted(r["request_id"] for r in records)
    assert spool_files(db.parent) == []


def test_records_are_counted_dropped_only_when_the_spool_fails_too(
    db: Path, lock: sqlite3.Connection, tmp_path: Path
) -> None:
    not_a_directory = tmp_path / "spool-here"
    not_a_directory.write_text("a file where the spool directory should be")
    store = open_store(db, queue_size=10, spool_dir=not_a_directory)
    for record in sample_records(30):
        store.add(record)
    lock.execute("COMMIT")
    store.close()
    assert store.dropped == 20 and store.spooled == 0  # the 10 in memory made it
    assert len(stored_ids(db)) == 10


def test_a_bad_record_is_dropped_alone(db: Path) -> None:
    records = sample_records(10)
    records[4] = records[4] | {"tier": None}  # NOT NULL: the database rejects this one row
    with open_store(db) as store:
        for record in records:
            store.add(record)
        store.flush()
        assert (store.written, store.dropped, store.spooled) == (9, 1, 0)
        assert store.writer.healthy  # a bad row is not an outage


def test_delete_before_removes_old_records_only(db: Path) -> None:
    records = sample_records(100)  # one millisecond apart
    with RecordStore(db) as store:
        store.add_many(records)
        cutoff = records[40]["timestamp"]
        assert store.delete_before(cutoff) == 40
        assert len(store.query()) == 60
        assert min(r.timestamp for r in store.query()) == cutoff


def test_loss_counters_are_exported_from_the_running_totals() -> None:
    from types import SimpleNamespace

    from middleware.metrics.metric_set import MetricSet
    from slo.sli import CATALOG
    from slo.spec import SLOSpec

    metrics = MetricSet(SLOSpec.default(), "tiny")
    store = SimpleNamespace(dropped=0, spooled=0)
    spans = SimpleNamespace(dropped=0)

    def scrape() -> dict[str, float]:
        metrics.observe_losses(store, spans)
        text = metrics.exposition("text/plain")[0].decode()
        values = {}
        for name in ("records_dropped", "records_spooled", "spans_dropped"):
            (line,) = [x for x in text.splitlines() if x.startswith(CATALOG[name].metric + "{")]
            values[name] = float(line.rsplit(" ", 1)[1])
        return values

    assert scrape() == {"records_dropped": 0, "records_spooled": 0, "spans_dropped": 0}
    store.spooled, spans.dropped = 7, 2
    assert scrape() == {"records_dropped": 0, "records_spooled": 7, "spans_dropped": 2}
    assert scrape()["records_spooled"] == 7  # a second scrape adds nothing
    store.dropped, store.spooled = 1, 9
    assert scrape() == {"records_dropped": 1, "records_spooled": 9, "spans_dropped": 2}
