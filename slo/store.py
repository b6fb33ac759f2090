"""Where records live: SQLite (WAL) by default, PostgreSQL by URL.

`add()` never blocks the request path: records go into a bounded queue and a background thread
writes them in batches. When the queue is full the record is dropped and counted, because a
slow disk must not become slow requests. Reads by time window and tier, as record objects or
as columns for the evaluator; JSONL import and export.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, insert, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import ConnectionPoolEntry
from sqlmodel import Session

from slo.columns import ALL_COLUMNS, LIST_COLUMNS, RecordColumns
from slo.errors import UsageError
from slo.records import FIELD_NAMES, REQUIRED_FLOAT, RequestRecord, iter_jsonl_dicts

logger = logging.getLogger(__name__)
TABLE = RequestRecord.__table__  # type: ignore[attr-defined]
_IMPORT_BATCH = 5000
_STOP = object()


def normalize_url(url: str | os.PathLike[str]) -> str:
    """'records.db' -> 'sqlite:///records.db'; 'postgresql://...' -> psycopg 3 driver."""
    url = os.fspath(url)
    if "://" not in url:
        return f"sqlite:///{url}"
    scheme, rest = url.split("://", 1)
    if scheme in ("postgres", "postgresql"):
        return f"postgresql+psycopg://{rest}"
    return url


def _enable_wal(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
    # WAL lets `slo check --db` read while the server writes; NORMAL sync is safe under WAL.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


_LIST_POSITIONS = tuple(i for i, name in enumerate(FIELD_NAMES) if name in LIST_COLUMNS)


def _row(record: RequestRecord | Mapping[str, Any]) -> tuple[Any, ...]:
    """A record (object or validated dict) as insert parameters in FIELD_NAMES order."""
    # An object's __dict__ holds the instrumented attributes' values; getattr costs 10x more.
    values = record if isinstance(record, Mapping) else record.__dict__
    row = [values.get(name) for name in FIELD_NAMES]
    for position in _LIST_POSITIONS:
        if row[position] is not None:
            row[position] = json.dumps(row[position])
    return tuple(row)


class RecordStore:
    def __init__(
        self,
        url: str | os.PathLike[str] = "sqlite:///records.db",
        *,
        queue_size: int = 10_000,
        batch_size: int = 500,
        flush_interval_s: float = 0.5,
    ) -> None:
        self.url = normalize_url(url)
        self.engine = self._connect(self.url)
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.written = 0
        self.dropped = 0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._count_lock = threading.Lock()
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        # Raw driver calls raise the driver's own errors, not SQLAlchemy's.
        self._db_errors: tuple[type[BaseException], ...] = (
            SQLAlchemyError,
            self.engine.dialect.loaded_dbapi.Error,
        )

    @staticmethod
    def _connect(url: str) -> Engine:
        try:
            if url.startswith("sqlite"):
                engine = create_engine(url, connect_args={"check_same_thread": False})
                event.listen(engine, "connect", _enable_wal)
            else:
                engine = create_engine(url, pool_pre_ping=True)
            TABLE.create(engine, checkfirst=True)
        except (SQLAlchemyError, ImportError, ValueError) as error:
            reason = str(error).splitlines()[0]
            raise UsageError(
                f"cannot open record store {url!r}: {reason}; check the URL, e.g. "
                "sqlite:///records.db or postgresql://user:pass@host/db"
            ) from None
        return engine

    # --- writing -------------------------------------------------------------------------------

    def add(self, record: RequestRecord | Mapping[str, Any]) -> None:
        """Queue a record for the background writer; never blocks (drops when full).

        A validated dict (`validate_record`) works too and is far cheaper to build.
        """
        if self._closed:
            raise RuntimeError("RecordStore is closed")
        self._ensure_writer()
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            with self._count_lock:
                self.dropped += 1
            return
        if self._queue.qsize() >= self.batch_size:
            self._wake.set()

    def add_many(self, records: Iterable[RequestRecord | Mapping[str, Any]]) -> int:
        """Write records now, in batches, on the calling thread (imports, tests)."""
        count = 0
        batch: list[tuple[Any, ...]] = []
        for record in records:
            batch.append(_row(record))
            if len(batch) >= _IMPORT_BATCH:
                count += self._insert(batch)
                batch = []
        if batch:
            count += self._insert(batch)
        return count

    def _insert(self, rows: list[tuple[Any, ...]]) -> int:
        # Straight to the driver's executemany: SQLAlchemy's per-row processing costs 4x more.
        sql, order = self._insert_sql
        if order is None:
            parameters: list[Any] = [dict(zip(FIELD_NAMES, row, strict=True)) for row in rows]
        elif order == list(range(len(FIELD_NAMES))):
            parameters = rows
        else:
            parameters = [tuple(row[i] for i in order) for row in rows]
        connection = self.engine.raw_connection()
        try:
            cursor = connection.cursor()
            cursor.executemany(sql, parameters)
            cursor.close()
            connection.commit()
        finally:
            connection.close()
        with self._count_lock:
            self.written += len(rows)
        return len(rows)

    def _ensure_writer(self) -> None:
        if self._writer is None:
            with self._writer_lock:
                if self._writer is None:
                    self._writer = threading.Thread(
                        target=self._write_loop, name="llm-slo-record-writer", daemon=True
                    )
                    self._writer.start()

    def _write_loop(self) -> None:
        # Wake on a timer (or when a full batch is waiting), never per record: a writer woken
        # by every `add` fights the request path for the GIL and commits one row at a time.
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            while True:
                batch = []
                while len(batch) < self.batch_size:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                if not batch:
                    break
                stop = any(item is _STOP for item in batch)
                records = [item for item in batch if item is not _STOP]
                try:
                    if records:
                        self._insert([_row(record) for record in records])
                except self._db_errors as error:
                    logger.warning(
                        "dropped %d records: %s", len(records), str(error).splitlines()[0]
                    )
                    with self._count_lock:
                        self.dropped += len(records)
                finally:
                    for _ in batch:
                        self._queue.task_done()
                if stop:
                    return

    def flush(self) -> None:
        """Wait until every queued record is written (or dropped)."""
        if self._writer is not None:
            self._wake.set()
            self._queue.join()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            self._queue.put(_STOP)  # blocking on purpose: close waits for the backlog
            self._wake.set()
            self._writer.join()
        self.engine.dispose()

    def __enter__(self) -> RecordStore:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def _insert_sql(self) -> tuple[str, list[int] | None]:
        """The INSERT in the driver's parameter style, and the order of positional parameters."""
        compiled = insert(TABLE).compile(dialect=self.engine.dialect, column_keys=list(FIELD_NAMES))
        if compiled.positional and compiled.positiontup is not None:
            return str(compiled), [FIELD_NAMES.index(key) for key in compiled.positiontup]
        return str(compiled), None

    def _fetch(self, statement: Any) -> list[Any]:
        """Rows of a SELECT as plain driver tuples (JSON columns may come back as text)."""
        compiled = statement.compile(dialect=self.engine.dialect)
        params: Any = compiled.params
        if compiled.positional and compiled.positiontup is not None:
            params = tuple(compiled.params[key] for key in compiled.positiontup)
        connection = self.engine.raw_connection()
        try:
            cursor = connection.cursor()
            cursor.execute(str(compiled), params)
            rows = list(cursor.fetchall())
            cursor.close()
            return rows
        finally:
            connection.close()

    # --- reading -------------------------------------------------------------------------------

    def _where(
        self, statement: Any, since: float | None, until: float | None, tier: str | None
    ) -> Any:
        if since is not None:
            statement = statement.where(TABLE.c.timestamp >= since)
        if until is not None:
            statement = statement.where(TABLE.c.timestamp <= until)
        if tier is not None:
            statement = statement.where(TABLE.c.tier == tier)
        return statement

    def query(
        self, since: float | None = None, until: float | None = None, tier: str | None = None
    ) -> list[RequestRecord]:
        """Records whose start time is in [since, until], oldest first."""
        statement = self._where(select(RequestRecord), since, until, tier)
        with Session(self.engine) as session:
            records = list(session.scalars(statement.order_by(TABLE.c.timestamp, TABLE.c.id)))
            session.expunge_all()
        return records

    def columns(
        self,
        since: float | None = None,
        until: float | None = None,
        tier: str | None = None,
        columns: Collection[str] = ALL_COLUMNS,
    ) -> RecordColumns:
        """The evaluator's fast read: only the needed columns, straight into arrays."""
        wanted = [name for name in ALL_COLUMNS if name in columns or name in REQUIRED_FLOAT]
        try:
            # Optional columns that are NULL in every selected row (client timings outside
            # `slo bench`, say) cost a C-level probe instead of a fetch and a conversion.
            absent = [
                name
                for name in wanted
                if name not in REQUIRED_FLOAT
                and not self._fetch(
                    self._where(select(TABLE.c[name]), since, until, tier)
                    .where(TABLE.c[name].is_not(None))
                    .limit(1)
                )
            ]
            names = ["tier", "outcome", *[name for name in wanted if name not in absent]]
            rows = self._fetch(
                self._where(select(*[TABLE.c[name] for name in names]), since, until, tier)
            )
        except self._db_errors as error:
            raise UsageError(
                f"cannot read records from {self.url}: {str(error).splitlines()[0]}"
            ) from None
        return RecordColumns.from_rows(names, rows).with_missing(absent)

    def iter_dicts(self, since: float | None = None, until: float | None = None,
                   tier: str | None = None) -> Iterator[dict[str, Any]]:  # fmt: skip
        statement = self._where(
            select(*[TABLE.c[name] for name in FIELD_NAMES]), since, until, tier
        )
        with self.engine.connect() as connection:
            result = connection.execution_options(yield_per=_IMPORT_BATCH).execute(
                statement.order_by(TABLE.c.timestamp, TABLE.c.id)
            )
            for row in result.mappings():
                yield {name: value for name, value in row.items() if value is not None}

    def import_jsonl(self, path: str | Path) -> int:
        """Validate and store every record of a JSONL file; returns how many."""
        return self.add_many(iter_jsonl_dicts(path))

    def export_jsonl(self, path: str | Path, since: float | None = None,
                     until: float | None = None, tier: str | None = None) -> int:  # fmt: skip
        count = 0
        with Path(path).open("w", encoding="utf-8") as handle:
            for row in self.iter_dicts(since, until, tier):
                handle.write(json.dumps(row, separators=(",", ":")))
                handle.write("\n")
                count += 1
        return count
