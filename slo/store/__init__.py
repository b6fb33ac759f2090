"""Where records live: SQLite (WAL) by default, PostgreSQL by URL.

`add()` never blocks the request path on the database: each record is appended to a local
spool file (`slo.store.spool`: a killed process loses none) and queued, and a background thread
writes the queue in batches (`slo.store.writer`). While the database is locked, full or
unreachable, records wait in that queue and in the spool file, and are replayed when it is
back: a slow or broken disk must become neither slow requests nor lost records. Reads by
time window and tier, as record objects or as columns for the evaluator; JSONL import and
export; `delete_before` for retention.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Collection, Iterable, Iterator, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import msgspec
from sqlalchemy import Engine, create_engine, event, insert, inspect, select
from sqlalchemy.exc import (
    DisconnectionError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlmodel import Session

from slo.errors import UsageError
from slo.records import BLAME_FIELDS, FIELD_NAMES, REQUIRED_FLOAT, RequestRecord, iter_jsonl_dicts
from slo.store.columns import ALL_COLUMNS, LIST_COLUMNS, RecordColumns
from slo.store.durable import default_spool_dir, fsync_wanted, spool_key, sqlite_pragmas
from slo.store.read import coded_columns, stored_keys
from slo.store.spool import Spool
from slo.store.writer import RecordWriter

logger = logging.getLogger(__name__)
TABLE = RequestRecord.__table__  # type: ignore[attr-defined]
_IMPORT_BATCH = 5000


def normalize_url(url: str | os.PathLike[str]) -> str:
    """'records.db' -> 'sqlite:///records.db'; 'postgresql://...' -> psycopg 3 driver."""
    url = os.fspath(url)
    if "://" not in url:
        return f"sqlite:///{url}"
    scheme, rest = url.split("://", 1)
    if scheme in ("postgres", "postgresql"):
        return f"postgresql+psycopg://{rest}"
    return url


# The fields written as JSON text: the lists of gaps and the delay blame.
_LIST_POSITIONS = tuple(
    i for i, name in enumerate(FIELD_NAMES) if name in LIST_COLUMNS or name in BLAME_FIELDS
)


_encode_json = msgspec.json.Encoder().encode


def _create_table(engine: Engine) -> None:
    """Create the records table and its indexes unless present. Workers of one server start
    together: when another process creates the table between the check and the CREATE, the
    CREATE fails, and the table being there now is success."""
    try:
        TABLE.create(engine, checkfirst=True)
    except SQLAlchemyError:
        if not inspect(engine).has_table(TABLE.name):
            raise
    _add_missing_columns(engine)


def _add_missing_columns(engine: Engine) -> None:
    """A database written by an older release lacks the newer (nullable) fields: add them, so
    an upgrade never loses a record. Another worker adding the same column first is success."""
    present = {column["name"] for column in inspect(engine).get_columns(TABLE.name)}
    for column in TABLE.columns:
        if column.name in present:
            continue
        column_type = column.type.compile(dialect=engine.dialect)
        try:
            with engine.begin() as connection:
                connection.exec_driver_sql(
                    f'ALTER TABLE {TABLE.name} ADD COLUMN "{column.name}" {column_type}'
                )
        except SQLAlchemyError:
            present = {c["name"] for c in inspect(engine).get_columns(TABLE.name)}
            if column.name not in present:
                raise


def _row(record: RequestRecord | Mapping[str, Any]) -> tuple[Any, ...]:
    """A record (object or validated dict) as insert parameters in FIELD_NAMES order."""
    # An object's __dict__ holds the instrumented attributes' values; getattr costs 10x more.
    values = record if isinstance(record, Mapping) else record.__dict__
    row = [values.get(name) for name in FIELD_NAMES]
    for position in _LIST_POSITIONS:
        if row[position] is not None:
            # msgspec writes floats ten times faster than json.dumps, digits that read back
            # to the same floats: a streamed request's 30-odd inter-token gaps are its
            # costliest field to store.
            row[position] = _encode_json(row[position]).decode()
    return tuple(row)


class RecordStore:
    def __init__(
        self,
        url: str | os.PathLike[str] = "sqlite:///records.db",
        *,
        queue_size: int = 10_000,
        batch_size: int = 500,
        flush_interval_s: float = 0.5,
        spool_dir: str | os.PathLike[str] | None = None,
        spool_fsync: bool | None = None,
        max_retry_s: float = 30.0,
    ) -> None:
        """`spool_fsync`: each record on the disk before `add()` returns (`slo.store.durable`;
        None: as LLM_SLO_SPOOL_FSYNC says, off by default)."""
        self.url = normalize_url(url)
        fsync = fsync_wanted(spool_fsync)
        self.engine = self._connect(self.url, fsync)
        self.batch_size = batch_size
        self.written = 0  # rows inserted, replayed ones included
        # Raw driver calls raise the driver's own errors, not SQLAlchemy's.
        dbapi = self.engine.dialect.loaded_dbapi
        self._db_errors: tuple[type[BaseException], ...] = (SQLAlchemyError, dbapi.Error)
        self._count_lock = threading.Lock()
        # Errors that say "the database is out" (locked, read-only, full, unreachable), not
        # "this batch is bad": the batch waits and is retried instead of being rejected.
        outage_errors: tuple[type[BaseException], ...] = (
            OperationalError,
            InterfaceError,
            DisconnectionError,
            PoolTimeout,
            OSError,
            dbapi.OperationalError,
            dbapi.InterfaceError,
            dbapi.InternalError,
        )
        self.writer = RecordWriter(
            lambda rows: self._insert(rows),  # looked up per call: tests slow it down
            _row,
            outage_errors,
            Spool(
                spool_dir if spool_dir is not None else default_spool_dir(self.url),
                spool_key(self.url),
                fsync=fsync,
            ),
            find_stored=lambda keys: stored_keys(self.engine, keys),
            label=self.url,
            queue_size=queue_size,
            batch_size=batch_size,
            flush_interval_s=flush_interval_s,
            max_retry_s=max_retry_s,
        )

    @staticmethod
    def _connect(url: str, fsync: bool) -> Engine:
        try:
            if url.startswith("sqlite"):
                engine = create_engine(url, connect_args={"check_same_thread": False})
                event.listen(engine, "connect", sqlite_pragmas(fsync))
            else:
                engine = create_engine(url, pool_pre_ping=True)
            _create_table(engine)
        except (SQLAlchemyError, ImportError, ValueError) as error:
            reason = str(error).splitlines()[0]
            raise UsageError(
                f"cannot open record store {url!r}: {reason}; check the URL, e.g. "
                "sqlite:///records.db or postgresql://user:pass@host/db"
            ) from None
        return engine

    # --- writing -------------------------------------------------------------------------------

    def add(self, record: RequestRecord | Mapping[str, Any]) -> None:
        """Queue a record for the background writer; never blocks on the database.

        The record is in the spool file when this returns. A validated dict
        (`validate_record`) works too and is far cheaper to build.
        """
        self.writer.add(record)

    def flush(self) -> None:
        """Wait until every queued record is in the database or, while it is out, the spool."""
        self.writer.flush()

    def close(self) -> None:
        """Write everything (to the database if it is up, else to the spool), then stop."""
        self.writer.close()
        self.engine.dispose()

    @property
    def dropped(self) -> int:
        """Records lost: expected to stay 0 (only when neither the database nor the spool file
        took them)."""
        return self.writer.dropped

    @property
    def spooled(self) -> int:
        return self.writer.spooled

    @property
    def replayed(self) -> int:
        return self.writer.replayed

    @property
    def spool(self) -> Spool:
        return self.writer.spool

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

    def delete_before(self, timestamp: float) -> int:
        """Delete records that started before `timestamp` (unix seconds); returns how many."""
        with self.engine.begin() as connection:
            result = connection.execute(TABLE.delete().where(TABLE.c.timestamp < timestamp))
        return int(result.rowcount or 0)

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

    def __enter__(self) -> RecordStore:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @cached_property
    def _insert_sql(self) -> tuple[str, list[int] | None]:
        """The INSERT in the driver's parameter style, and the order of positional parameters
        (compiled once: SQLAlchemy's compiler is most of a small batch's cost, and the writer
        thread holds the GIL while it runs)."""
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
            if self.engine.dialect.name == "sqlite" and not set(wanted) & set(LIST_COLUMNS):
                coded = coded_columns(wanted, self.engine.raw_connection, since, until, tier)
                if coded is not None:
                    return coded
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

    def iter_dicts(
        self, since: float | None = None, until: float | None = None, tier: str | None = None
    ) -> Iterator[dict[str, Any]]:
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

    def export_jsonl(
        self,
        path: str | Path,
        since: float | None = None,
        until: float | None = None,
        tier: str | None = None,
    ) -> int:
        count = 0
        with Path(path).open("w", encoding="utf-8") as handle:
            for row in self.iter_dicts(since, until, tier):
                handle.write(json.dumps(row, separators=(",", ":")))
                handle.write("\n")
                count += 1
        return count
