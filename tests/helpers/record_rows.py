"""The rows a server's SQLite record store holds, read with sqlite3 itself (not through
RecordStore), oldest first: what a test checks a process wrote."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

TABLE = "llm_slo_request_records"


def records(db: Path) -> list[dict[str, object]]:
    with contextlib.closing(sqlite3.connect(db)) as connection:
        connection.row_factory = sqlite3.Row
        rows = connection.execute(f"SELECT * FROM {TABLE} ORDER BY timestamp").fetchall()
    return [dict(row) for row in rows]
