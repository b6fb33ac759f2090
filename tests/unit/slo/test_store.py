from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import slo.store.columns
from slo.check.evaluate import columns_needed
from slo.records import RecordError, iter_jsonl_dicts, read_jsonl, record_from_dict
from slo.spec import SLOSpec
from slo.store import RecordStore, normalize_url
from slo.store.columns import ALL_COLUMNS, RecordColumns, load_jsonl_columns
from slo.store.read import coded_columns
from tests.helpers.record_samples import START, sample_records, write_sample_file
from tests.helpers.store_round_trip import check_round_trip

NEEDED = columns_needed(SLOSpec.default())


def assert_same_columns(got: RecordColumns, expected: RecordColumns) -> None:
    assert got.tier.tolist() == expected.tier.tolist()
    assert got.outcome.tolist() == expected.outcome.tolist()
    assert sorted(got.numbers) == sorted(expected.numbers)
    for name, values in expected.numbers.items():
        np.testing.assert_array_equal(got.numbers[name], values, err_msg=name)
    assert sorted(got.gaps) == sorted(expected.gaps)
    for name, gaps in expected.gaps.items():
        np.testing.assert_array_equal(got.gaps[name].values, gaps.values, err_msg=name)
        np.testing.assert_array_equal(got.gaps[name].owner, gaps.owner, err_msg=name)


def test_sqlite_round_trips_100k_records(tmp_path: Path) -> None:
    with RecordStore(f"sqlite:///{tmp_path / 'records.db'}") as store:
        check_round_trip(store, tmp_path, 100_000)
        assert store.written == 100_000
        with store.engine.connect() as connection:
            mode = connection.exec_driver_sql("PRAGMA journal_mode").scalar()
        assert mode == "wal"


def test_add_is_batched_in_the_background(tmp_path: Path) -> None:
    records = [record_from_dict(r) for r in sample_records(1200)]
    with RecordStore(tmp_path / "r.db", batch_size=100) as store:
        for record in records:
            store.add(record)
        store.flush()
        assert store.written == 1200 and store.dropped == 0
        assert len(store.query(tier="premium")) == 400


def test_flush_waits_for_records_added_from_many_threads_at_once(tmp_path: Path) -> None:
    """The queue is a lock-free deque: records added from several threads while the writer
    drains and flush() waits are each written once, and flush() returns only when all are."""
    records = [record_from_dict(r) for r in sample_records(2000)]
    with RecordStore(tmp_path / "r.db", batch_size=37, flush_interval_s=0.001) as store:
        start = threading.Barrier(5)

        def add_share(share: list[Any]) -> None:
            start.wait()
            for record in share:
                store.add(record)

        threads = [threading.Thread(target=add_share, args=(records[i::4],)) for i in range(4)]
        for thread in threads:
            thread.start()
        start.wait()
        store.flush()  # may return before the adds end: then it saw a moment with none queued
        for thread in threads:
            thread.join()
        store.flush()
        assert store.written == 2000 and store.spooled == 0 and store.dropped == 0
        written = {r.request_id for r in store.query()}
        assert written == {r.request_id for r in records}


def test_a_queue_size_of_zero_means_no_bound(tmp_path: Path) -> None:
    """As `queue.Queue(maxsize=0)` meant: records wait in memory, none go to the spool."""
    records = [record_from_dict(r) for r in sample_records(300)]
    with RecordStore(tmp_path / "r.db", queue_size=0, flush_interval_s=60) as store:
        for record in records:
            store.add(record)
        assert store.spooled == 0
        store.flush()
        assert store.written == 300 and store.spooled == 0 and store.dropped == 0


def test_add_spools_instead_of_blocking_when_the_queue_is_full(tmp_path: Path) -> None:
    store = RecordStore(str(tmp_path / "r.db"), queue_size=5)
    gate = threading.Event()
    original = store._insert

    def slow_insert(rows):  # type: ignore[no-untyped-def]
        gate.wait(10)
        return original(rows)

    store._insert = slow_insert  # type: ignore[method-assign]
    records = [record_from_dict(r) for r in sample_records(50)]
    for record in records:
        store.add(record)  # must return at once even though the writer is stuck
    assert store.spooled >= 50 - 5 - store.batch_size
    assert store.spooled > 0 and store.dropped == 0
    gate.set()
    store.close()
    assert store.written == 50 and store.replayed == store.spooled and store.dropped == 0
    with RecordStore(tmp_path / "r.db") as reader:
        assert len(reader.query()) == 50
    assert not list(tmp_path.glob("llm-slo-spool-*"))


def test_bad_jsonl_line_is_named(tmp_path: Path) -> None:
    records = sample_records(5)
    path = write_sample_file(records, tmp_path / "run.jsonl")
    lines = path.read_text().splitlines()
    lines[3] = lines[3].replace('"e2e_s":', '"e2e_s":"slow","x":')
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(RecordError, match=r"run\.jsonl:4: field 'e2e_s': expected a finite number"):
        read_jsonl(path)
    with pytest.raises(RecordError, match=r"run\.jsonl:4: field 'e2e_s'"):
        load_jsonl_columns(path)
    path.write_text(path.read_text().replace(lines[3], "{not json"))
    with pytest.raises(RecordError, match=r"run\.jsonl:4: not valid JSON"):
        load_jsonl_columns(path)


@pytest.mark.parametrize("layout", ["compact", "blank lines", "crlf", "no final newline"])
def test_jsonl_columns_match_the_validating_reader(
    layout: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = write_sample_file(sample_records(2000), tmp_path / "run.jsonl").read_text()
    text = {
        "compact": text,
        "blank lines": "\n" + text.replace("\n", "\n\n \t\n", 40),
        "crlf": text.replace("\n", "\r\n"),
        "no final newline": text.rstrip("\n"),
    }[layout]
    path = tmp_path / "run.jsonl"
    path.write_text(text)
    monkeypatch.setattr(slo.store.columns, "_CHUNK_BYTES", 50_000)  # a dozen chunks

    def no_fallback(_: object) -> None:
        raise AssertionError("the fast reader gave up")

    monkeypatch.setattr(slo.store.columns, "iter_jsonl_dicts", no_fallback)
    for wanted in (ALL_COLUMNS, NEEDED):
        expected = RecordColumns.from_dicts(list(iter_jsonl_dicts(path)), wanted)
        assert_same_columns(load_jsonl_columns(path, wanted), expected)


def test_two_records_on_one_line_are_named(tmp_path: Path) -> None:
    lines = write_sample_file(sample_records(5), tmp_path / "run.jsonl").read_text().splitlines()
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join([*lines[:2], lines[2] + " " + lines[3], lines[4]]) + "\n")
    with pytest.raises(RecordError, match=r"run\.jsonl:3: not valid JSON \(Extra data"):
        load_jsonl_columns(path)


def test_store_columns_match_the_generic_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite's coded read (one query, packed codes) gives what rows-then-columns gives."""
    with RecordStore(tmp_path / "r.db") as store:
        store.add_many(sample_records(3000))
        windows: list[dict[str, Any]] = [
            {}, {"since": START + 1.0, "until": START + 2.0}, {"tier": "batch"},
        ]  # fmt: skip
        assert coded_columns(sorted(NEEDED), store.engine.raw_connection) is not None
        coded = [store.columns(**window, columns=NEEDED) for window in windows]
        assert "client_tpot_s" in coded[0].numbers  # absent everywhere: NaN, as asked
        monkeypatch.setattr("slo.store.coded_columns", lambda *args: None)
        for window, columns in zip(windows, coded, strict=True):
            assert_same_columns(columns, store.columns(**window, columns=NEEDED))


def test_store_columns_keep_an_unknown_outcome(tmp_path: Path) -> None:
    with RecordStore(tmp_path / "r.db") as store:
        store.add_many(sample_records(30))
    with sqlite3.connect(tmp_path / "r.db") as connection:
        connection.execute("UPDATE llm_slo_request_records SET outcome = 'exploded' WHERE id = 7")
    with RecordStore(tmp_path / "r.db") as store:
        assert store.columns(columns=NEEDED).outcome.tolist().count("exploded") == 1


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("outcome", "exploded", "expected one of ok, client_error"),
        ("ttft_s", -1, "expected a finite number of seconds"),
        ("output_tokens", 1.5, "expected a whole number"),
        ("itl_s", [0.1, "x"], "expected a list of numbers"),
        ("tier", None, "missing field 'tier'"),
    ],
)
def test_record_validation(field: str, value: object, message: str) -> None:
    data = sample_records(1)[0] | {field: value}
    with pytest.raises(RecordError, match=message):
        record_from_dict(data, "here")


def test_records_never_carry_text() -> None:
    data = sample_records(1)[0] | {"prompt": "secret", "completion": "secret"}
    assert "secret" not in record_from_dict(data).to_json_line()


def test_urls() -> None:
    assert normalize_url("records.db") == "sqlite:///records.db"
    assert normalize_url("postgresql://u:p@h/db") == "postgresql+psycopg://u:p@h/db"
    assert normalize_url("sqlite:///x.db") == "sqlite:///x.db"


def test_a_table_created_by_another_worker_meanwhile_is_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers starting together race to create the table: the loser's CREATE fails."""
    from sqlalchemy.exc import OperationalError

    import slo.store
    from slo.errors import UsageError

    create = slo.store.TABLE.create

    def lose_the_race(bind: Any, checkfirst: bool = True) -> None:
        create(bind, checkfirst=checkfirst)  # the other worker's CREATE lands first
        raise OperationalError("CREATE TABLE", {}, Exception("table records already exists"))

    monkeypatch.setattr(slo.store.TABLE, "create", lose_the_race)
    store = RecordStore(f"sqlite:///{tmp_path / 'raced.db'}")
    store.close()

    def fail(bind: Any, checkfirst: bool = True) -> None:
        raise OperationalError("CREATE TABLE", {}, Exception("disk I/O error"))

    monkeypatch.setattr(slo.store.TABLE, "create", fail)
    with pytest.raises(UsageError, match="cannot open record store"):
        RecordStore(f"sqlite:///{tmp_path / 'broken.db'}")
