"""The record store's round trip, checked alike on SQLite (unit) and PostgreSQL (integration):
JSONL in and back out unchanged, a query by tier and window, the columns read back."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from slo.store import RecordStore
from slo.store.columns import load_jsonl_columns
from tests.helpers.record_samples import START, sample_records, write_sample_file


def check_round_trip(store: RecordStore, tmp_path: Path, count: int) -> None:
    """Import JSONL, export it back unchanged; query by tier and window; columns agree."""
    records = sample_records(count)
    source = write_sample_file(records, tmp_path / "in.jsonl")
    assert store.import_jsonl(source) == count
    exported = tmp_path / "out.jsonl"
    assert store.export_jsonl(exported) == count
    assert exported.read_text() == source.read_text()  # every field, every digit

    since, until = START + 10.0, START + 20.0  # records are 1 ms apart
    window = store.query(since=since, until=until, tier="batch")
    expected = [r for r in records if since <= r["timestamp"] <= until and r["tier"] == "batch"]
    assert [r.request_id for r in window] == [r["request_id"] for r in expected]
    assert window[0].itl_s == expected[0].get("itl_s")

    from_db = store.columns()
    from_file = load_jsonl_columns(source)
    order = np.argsort(from_db.number("timestamp"), kind="stable")
    for name, values in from_file.numbers.items():
        np.testing.assert_array_equal(from_db.number(name)[order], values, err_msg=name)
    np.testing.assert_array_equal(from_db.tier[order], from_file.tier)
    assert from_db.gaps["itl_s"].values.size == from_file.gaps["itl_s"].values.size
