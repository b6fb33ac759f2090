"""A record's `delay_blame` (the engine's blame, a bounded JSON object) survives every way a
record travels: the SQLite store (JSON text in its column), the journal's JSONL line and a
JSONL file read back, validated."""

from __future__ import annotations

import json
from pathlib import Path

from slo.records import RequestRecord, iter_jsonl, validate_record
from slo.store import RecordStore

BLAME = {
    "queue_s": 0.25,
    "preempted_s": 0.0,
    "decode_s": 1.5,
    "decode_only_s": 1.25,
    "interference_s": 0.25,
    "by_tier": [
        {"cause": "queue", "tier": "batch", "s": 0.2, "requests": 3},
        {"cause": "queue", "tier": "none", "s": 0.05, "requests": 0},
        {"cause": "interference", "tier": "batch", "s": 0.25, "requests": 1},
    ],
    "top": [{"cause": "interference", "request_id": "b7", "tier": "batch", "s": 0.25}],
}


def record(request_id: str, blame: dict[str, object] | None) -> dict[str, object]:
    values = {"request_id": request_id, "tier": "premium", "timestamp": 1.0, "e2e_s": 2.0}
    return validate_record({**values, "delay_blame": blame})


def test_the_store_keeps_the_blame(store: RecordStore) -> None:
    store.add(record("with", BLAME))
    store.add(record("without", None))
    store.flush()
    kept = {r.request_id: r.delay_blame for r in store.query()}
    assert kept == {"with": BLAME, "without": None}


def test_a_jsonl_file_keeps_the_blame(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text(RequestRecord(**record("with", BLAME)).to_json_line() + "\n")
    assert json.loads(path.read_text())["delay_blame"] == BLAME
    assert [r.delay_blame for r in iter_jsonl(path)] == [BLAME]
