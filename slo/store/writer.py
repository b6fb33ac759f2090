"""The record store's background writer: batches off the request path, no record lost.

Records wait in a bounded in-memory queue; a thread writes them in batches. When the database
is out (locked, full, unreachable) the queue is the buffer; beyond it, or when a write fails,
records go to the spool file (`slo.store.spool`), and the writer retries with exponential backoff,
replays the spool when the database is back, then removes the file. `dropped` counts only
records that even the spool could not take.

After `close()` no thread is left, yet records may still come: a server that drains its
in-flight requests after a signal already flushed the store (`middleware/lifespan.py`). Such a
record is written before `add()` returns, on the calling thread, instead of being refused.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from slo.store.spool import Spool

logger = logging.getLogger("slo.store")

Row = tuple[Any, ...]


def first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


class RecordWriter:
    def __init__(
        self,
        insert_rows: Callable[[list[Row]], int],
        to_row: Callable[[Any], Row],
        outage_errors: tuple[type[BaseException], ...],
        spool: Spool,
        *,
        label: str,
        queue_size: int,
        batch_size: int,
        flush_interval_s: float,
        max_retry_s: float,
    ) -> None:
        self._insert_rows = insert_rows
        self._row = to_row
        self._outage_errors = outage_errors
        self.spool = spool
        self.label = label  # the store's URL, for logs
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.max_retry_s = max_retry_s
        self.dropped = 0  # records lost: only when even the spool file cannot be written
        self.spooled = 0  # records written to the spool file
        self.replayed = 0  # spooled records since inserted into the database
        # Records waiting for the writer: a deque, appended to and popped from without a lock
        # (each is atomic), because `queue.Queue.put` takes a lock and notifies a condition on
        # every record, about 10k instructions of a request's report. `queue_size` bounds it
        # (checked before each append, so threads adding at once may pass it by a few).
        self._queue: collections.deque[Any] = collections.deque()
        # 0 or less: no bound, as queue.Queue's maxsize meant.
        self._queue_size = queue_size if queue_size > 0 else sys.maxsize
        # flush() waits on this until nothing is queued and no batch is held.
        self._drained = threading.Condition()
        # Records taken from the queue and not yet stored or spooled, by every drain at once
        # (the writer's last round and a late `_write_now` may overlap while closing).
        self._holding = 0
        self._count_lock = threading.Lock()
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()
        self._late_lock = threading.Lock()  # writes on callers' threads, once the writer is gone
        self._wake = threading.Event()
        self._urgent = threading.Event()  # flush() or close() waits: stop holding records
        self._stopping = False
        self._closed = False
        self._healthy = True
        self._retry_delay_s = 0.0
        self._retry_at = 0.0
        if spool.adopt_orphans():
            self._ensure_writer()  # a crashed run left records: replay them now
            self._wake.set()

    @property
    def healthy(self) -> bool:
        """False from a failed write until the next successful one."""
        return self._healthy

    def add(self, record: Mapping[str, Any] | Any) -> None:
        """Queue a record for the background writer; never blocks on the database.

        Beyond the in-memory queue the record goes to the spool file. A validated dict
        (`validate_record`) works too and is far cheaper to build. After `close()` the record
        is written (or spooled) before this returns.
        """
        if self._closed:
            self._write_now(record)
            return
        if self._writer is None:
            self._ensure_writer()
        queued = self._queue
        if len(queued) >= self._queue_size:
            self._spool([record])
            return
        queued.append(record)
        if self._closed:  # close() drained the queue between the check and the put
            self._write_now(None)
            return
        # Wake the writer early when a full batch waits (its timer wakes it anyway).
        if self._healthy and len(queued) >= self.batch_size:
            self._wake.set()

    def _write_now(self, record: Mapping[str, Any] | Any | None) -> None:
        """Write `record` and whatever waits in the queue on this thread (the writer is gone)."""
        with self._late_lock:
            if record is not None:
                if len(self._queue) >= self._queue_size:
                    self._spool([record])
                else:
                    self._queue.append(record)
            spooled = self.spooled
            # While the database is out, a late record waits for the next retry no longer than
            # it takes to spool it: the caller is a request, it cannot wait out a backoff.
            due = self._healthy or time.monotonic() >= self._retry_at
            self._pump(try_database=due, spill=True)
            if self.spooled != spooled:
                self.spool.close()  # the file stays while it holds records; the handle does not

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
        # While the database is out, wake only when the next retry is due or someone waits.
        while True:
            timeout = (
                self.flush_interval_s
                if self._healthy
                else max(0.0, self._retry_at - time.monotonic())
            )
            self._wake.wait(timeout)
            self._wake.clear()
            stopping = self._stopping  # read once: a stop seen late gets the next round
            urgent = self._urgent.is_set() or stopping
            self._urgent.clear()  # before draining: a later flush() gets a round of its own
            due = self._healthy or time.monotonic() >= self._retry_at or stopping
            if due or urgent:
                try:
                    self._pump(try_database=due, spill=urgent)
                except Exception as error:  # a dead writer would hang flush() and close()
                    logger.exception("llm-slo: record writer error; retrying")
                    self._mark_down(error)
            if stopping:
                return

    def _pump(self, try_database: bool, spill: bool) -> None:
        """Replay the spool, then drain the queue into the database. On an outage the queue
        stays the in-memory buffer, or goes to the spool when someone waits (`spill`)."""
        up = try_database and self._replay()
        queued, take = self._queue, self._queue.popleft
        while up or spill:
            with self._drained:  # taken and counted in one step: flush() sees one or the other
                batch = [take() for _ in range(min(self.batch_size, len(queued)))]
                self._holding += len(batch)
            if not batch:
                return
            try:
                stored = self._store(batch) if up else 0
                up = stored == len(batch)
                if not up:
                    self._spool(batch[stored:])
            finally:
                with self._drained:
                    self._holding -= len(batch)
                    self._drained.notify_all()

    def _store(self, records: list[Any]) -> int:
        """Insert records; returns how many from the front are done (stored, or dropped as
        bad data). Fewer than all means the database is out and the rest is not stored."""
        rows: list[Row | None] = []
        for record in records:
            try:
                rows.append(self._row(record))
            except (TypeError, ValueError) as error:
                self._drop(1, f"unserializable record: {error}")
                rows.append(None)
        good = [row for row in rows if row is not None]
        try:
            if good:
                self._insert_rows(good)
            self._mark_up()
            return len(records)
        except Exception as error:
            if isinstance(error, self._outage_errors):
                self._mark_down(error)
                return 0
            first_error = error
        # Not an outage but this batch: find the bad rows one by one, store the rest.
        logger.warning("record batch rejected (%s); retrying row by row", first_line(first_error))
        for index, row in enumerate(rows):
            if row is None:
                continue
            try:
                self._insert_rows([row])
            except Exception as error:
                if isinstance(error, self._outage_errors):
                    self._mark_down(error)
                    return index
                self._drop(1, f"record rejected by the database: {first_line(error)}")
        self._mark_up()
        return len(records)

    def _replay(self) -> bool:
        """Move spooled records into the database; False when it is (still) out."""
        if not self.spool.has_records:
            return True
        while True:
            entries = self.spool.read(self.batch_size)
            if not entries:
                return True
            records = [record for record, _ in entries if record is not None]
            stored = self._store(records)
            if stored < len(records):
                if stored:  # keep what went in, so that the next try does not repeat it
                    self._consume(entries[: self._entries_holding(entries, stored)])
                return False
            self._consume(entries)

    def _consume(self, entries: list[tuple[dict[str, Any] | None, int]]) -> None:
        unreadable = sum(record is None for record, _ in entries)
        if unreadable:
            self._drop(unreadable, f"unreadable lines in a spool file under {self.spool.directory}")
        self.spool.consumed(entries[-1][1], len(entries))
        self._count("replayed", len(entries) - unreadable)

    @staticmethod
    def _entries_holding(entries: list[tuple[dict[str, Any] | None, int]], stored: int) -> int:
        """How many entries from the front hold the first `stored` records."""
        seen = 0
        for index, (record, _) in enumerate(entries):
            seen += record is not None
            if seen == stored:
                return index + 1
        return len(entries)

    def _spool(self, records: list[Any]) -> None:
        if not records:
            return
        try:
            self._count("spooled", self.spool.append(records))
        except (OSError, TypeError, ValueError) as error:
            self._drop(len(records), f"cannot spool to {self.spool.path}: {error}")

    def _mark_down(self, error: BaseException) -> None:
        self._retry_delay_s = min(self.max_retry_s, max(0.1, self._retry_delay_s * 2))
        self._retry_at = time.monotonic() + self._retry_delay_s
        if self._healthy:
            logger.warning(
                "record store %s unavailable (%s): records wait in memory and in %s; "
                "retrying with backoff",
                self.label,
                first_line(error),
                self.spool.path,
            )
        self._healthy = False

    def _mark_up(self) -> None:
        if not self._healthy:
            logger.warning("record store %s is back: writing and replaying records", self.label)
        self._healthy = True
        self._retry_delay_s = 0.0

    def _drop(self, count: int, reason: str) -> None:
        logger.error("llm-slo: dropped %d records: %s", count, reason)
        self._count("dropped", count)

    def _count(self, counter: str, count: int) -> None:
        with self._count_lock:
            setattr(self, counter, getattr(self, counter) + count)

    def flush(self) -> None:
        """Wait until every queued record is in the database or, while it is out, the spool."""
        if self._writer is not None and not self._closed:
            with self._drained:
                while self._queue or self._holding:
                    self._urgent.set()
                    self._wake.set()
                    self._drained.wait()

    def close(self) -> None:
        """Write everything (to the database if it is up, else to the spool), then stop."""
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            self._stopping = True
            self._wake.set()
            self._writer.join()
        with self._late_lock:  # records that raced past `add`'s closed check
            if self._queue:
                self._pump(try_database=self._healthy, spill=True)
            left = self.spool.has_records
            self.spool.close()
        if left:
            logger.warning(
                "llm-slo: records stay in spool files under %s; the next store there replays them",
                self.spool.directory,
            )
