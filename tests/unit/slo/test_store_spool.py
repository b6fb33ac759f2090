"""The spool as the record store's journal (slo/store/spool.py, slo/store/replay.py): a record
is in the spool file when `add()` returns, and a store killed with SIGKILL (a real one, in a
child process) leaves every record it was given to the next store, which replays each exactly
once: not the ones already in the database, not a line a kill cut short, and nothing more when
the same file is replayed twice.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from slo.errors import UsageError
from slo.records import read_jsonl
from slo.store import RecordStore
from slo.store.spool import Spool, record_line
from tests.helpers.record_samples import sample_records

# A child that adds records to a store and is killed with SIGKILL, as the OOM killer would.
# `flushed` records go to the database first; with `cut` "before-commit" the child dies right
# after the database took the rest, before the spool is told (the fake only picks the moment).
KILLED_STORE = """
import os, signal, sys
from slo.store import RecordStore
from tests.helpers.record_samples import sample_records

db, flushed, total, cut = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
records = sample_records(total)
store = RecordStore(db, flush_interval_s=60)
for record in records[:flushed]:
    store.add(record)
store.flush()
if cut == "before-commit":
    store.spool.commit = lambda position: os.kill(os.getpid(), signal.SIGKILL)
for record in records[flushed:]:
    store.add(record)
if cut == "before-commit":
    store.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def kill_a_store(db: Path, flushed: int, total: int, cut: str = "after-add") -> None:
    root = Path(__file__).resolve().parents[3]
    child = subprocess.run(
        [sys.executable, "-c", KILLED_STORE, str(db), str(flushed), str(total), cut],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -9, child.stderr  # killed, not ended


def stored_ids(db: Path) -> Counter[str]:
    with sqlite3.connect(db) as connection:
        rows = connection.execute("SELECT request_id FROM llm_slo_request_records").fetchall()
    return Counter(row[0] for row in rows)


def spool_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("llm-slo-spool-*"))


def expected_ids(total: int) -> Counter[str]:
    return Counter(record["request_id"] for record in sample_records(total))


def restart(db: Path) -> tuple[int, int]:
    """A new store on the same database: it replays what it finds; (replayed, dropped)."""
    store = RecordStore(db)
    store.close()  # the last round replays whatever is left
    return store.replayed, store.dropped


def test_a_record_is_in_the_spool_file_when_add_returns(tmp_path: Path) -> None:
    records = sample_records(3)
    with RecordStore(tmp_path / "r.db", flush_interval_s=60) as store:
        for record in records:
            store.add(record)
        assert store.written == 0  # the writer has not run: only the file has them
        (spool,) = spool_files(tmp_path)
        assert [r.request_id for r in read_jsonl(spool)] == [r["request_id"] for r in records]
        store.flush()
        assert store.written == 3 and spool.stat().st_size == 0  # all in: emptied
    assert spool_files(tmp_path) == []


def test_a_killed_store_loses_no_record_and_the_next_replays_each_once(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    kill_a_store(db, flushed=40, total=100)
    assert sum(stored_ids(db).values()) == 40  # the rest were only in memory and the file
    assert restart(db) == (60, 0)
    assert stored_ids(db) == expected_ids(100)
    assert spool_files(tmp_path) == []
    assert restart(db) == (0, 0) and stored_ids(db) == expected_ids(100)


def test_records_in_the_database_before_the_kill_are_not_replayed_again(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    kill_a_store(db, flushed=30, total=80, cut="before-commit")
    assert stored_ids(db) == expected_ids(80)  # all in, the spool not told about the last 50
    (left,) = spool_files(tmp_path)
    assert len(read_jsonl(left)) == 50
    assert restart(db) == (50, 0)  # read back, and found in the database
    assert stored_ids(db) == expected_ids(80)


def test_a_line_cut_short_by_the_kill_is_dropped_and_the_rest_replayed(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    kill_a_store(db, flushed=0, total=20)
    (left,) = spool_files(tmp_path)
    whole = record_line(sample_records(21)[20])
    with left.open("ab") as handle:  # a torn write: the kill came in the middle of a line
        handle.write(whole[: len(whole) // 2])
    assert restart(db) == (20, 1)
    assert stored_ids(db) == expected_ids(20)
    assert spool_files(tmp_path) == []


def test_replaying_the_same_file_twice_adds_nothing_the_second_time(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    kill_a_store(db, flushed=10, total=50)
    (left,) = spool_files(tmp_path)
    copy = tmp_path / "copy"
    shutil.copy(left, copy)
    assert restart(db) == (40, 0)
    # As if the replaying store had been killed after its inserts, before removing the file.
    shutil.copy(copy, left)
    assert restart(db) == (40, 0)  # read back again, every one found in the database
    assert stored_ids(db) == expected_ids(50)
    assert spool_files(tmp_path) == []


def test_segments_go_once_all_their_lines_are_in(tmp_path: Path) -> None:
    records = [{"request_id": f"r{i}", "timestamp": float(i)} for i in range(9)]
    lines = [record_line(record) for record in records]  # all of one length
    spool = Spool(tmp_path, "key", segment_bytes=3 * len(lines[0]))
    ends = [spool.append(line) for line in lines]
    assert ends[-1] == spool.end == sum(map(len, lines))
    assert len(spool_files(tmp_path)) == 3  # three lines a file
    read = spool.read(ends[1], spool.end, limit=100)  # from the third line, across the files
    assert read == [(record, end) for record, end in zip(records[2:], ends[2:], strict=True)]
    assert [end for _, end in spool.read(ends[1], spool.end, limit=2)] == ends[2:4]
    spool.commit(ends[3])  # the first file's lines are in, and one of the second's
    assert len(spool_files(tmp_path)) == 2 and spool.has_records
    spool.commit(ends[-1])
    assert not spool.has_records and len(spool_files(tmp_path)) == 0
    assert spool.append(lines[0]) == ends[-1] + len(lines[0])  # a new file, positions go on
    spool.close()  # what it holds is not in the database: it stays, for the next store
    assert [record for record, _ in spool.read(ends[-1], spool.end, 10)] == []
    (left,) = spool_files(tmp_path)
    assert left.read_bytes() == lines[0]


def test_spool_fsync_syncs_each_append_and_each_sqlite_commit(tmp_path: Path) -> None:
    with RecordStore(tmp_path / "r.db", spool_fsync=True) as store:
        store.add(sample_records(1)[0])
        assert store.spool._fd is not None
        assert fcntl.fcntl(store.spool._fd, fcntl.F_GETFL) & os.O_DSYNC
        with store.engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
        store.flush()
        assert store.written == 1
    with RecordStore(tmp_path / "r.db") as store:
        store.add(sample_records(1)[0])
        assert store.spool._fd is not None
        assert not fcntl.fcntl(store.spool._fd, fcntl.F_GETFL) & os.O_DSYNC


def test_the_environment_can_ask_for_fsync_and_a_wrong_value_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLM_SLO_SPOOL_FSYNC", "1")
    with RecordStore(tmp_path / "r.db") as store:
        assert store.spool.fsync
    monkeypatch.setenv("LLM_SLO_SPOOL_FSYNC", "sometimes")
    with pytest.raises(UsageError, match=r"LLM_SLO_SPOOL_FSYNC='sometimes'.*use 1 .* or 0"):
        RecordStore(tmp_path / "r.db")
