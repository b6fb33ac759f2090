"""The record store's background writer: batches off the request path, no record lost.

`add()` appends each record to the spool file (`slo.store.spool`: in the page cache when it
returns, so a killed process keeps it) and queues it in a bounded in-memory queue; a thread
writes the queue to the database in batches, in the file's order, and tells the spool how far
the file is in. When the database is out (locked, full, unreachable) the queue is the buffer;
a record beyond it, or in a batch whose write failed, is only in the file: the writer retries
with exponential backoff and, when the database is back, reads such records back from the file
and inserts those not in the database yet (`slo.store.replay`), so each lands exactly once.
`dropped` counts only records that neither the database nor the spool took.

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

from slo.store.replay import Key, Replay
from slo.store.spool import Spool, record_line

logger = logging.getLogger("slo.store")

Row = tuple[Any, ...]
# A queued record, with where its line starts and ends in the spool (None: not in the file).
Item = tuple[Any, int | None, int]


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
        find_stored: Callable[[list[Key]], set[Key]],
        label: str,
        queue_size: int,
        batch_size: int,
        flush_interval_s: float,
        max_retry_s: float,
    ) -> None:
        """`find_stored`: which of these (request id, start time) keys the database holds."""
        self._insert_rows = insert_rows
        self._row = to_row
        self._outage_errors = outage_errors
        self.spool = spool
        self.label = label  # the store's URL, for logs
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.max_retry_s = max_retry_s
        self.dropped = 0  # records lost: only when neither the database nor the spool took them
        self.spooled = 0  # records that went to the database by way of the spool file
        self.replayed = 0  # records read back from the spool file into the database
        # Records waiting for the writer: a deque, appended to and popped from without a lock
        # of its own (each is atomic), because `queue.Queue.put` takes a lock and notifies a
        # condition on every record. `queue_size` bounds it (0 or less: no bound).
        self._queue: collections.deque[Item] = collections.deque()
        self._queue_size = queue_size if queue_size > 0 else sys.maxsize
        # Held across a record's append and its enqueueing: the queue's order is the file's.
        self._order_lock = threading.Lock()
        self._journal_failing = False  # logged once, until an append succeeds again
        # flush() waits on this until nothing is queued and no batch is held.
        self._drained = threading.Condition()
        self._holding = 0  # records taken from the queue and not yet stored or left in the file
        self._count_lock = threading.Lock()
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()
        # One drain at a time (the writer's rounds, writes on callers' threads once it is
        # gone): the spool's committed position moves in the file's order.
        self._pump_lock = threading.Lock()
        self._wake = threading.Event()
        self._urgent = threading.Event()  # flush() or close() waits: stop holding records
        self._stopping = False
        self._closed = False
        self._healthy = True
        self._retry_delay_s = 0.0
        self._retry_at = 0.0
        self.replay = Replay(spool, self._store, find_stored, self._count, self._mark_down)
        if spool.adopt_orphans():
            self._ensure_writer()  # a crashed run left records: replay them now
            self._wake.set()

    @property
    def healthy(self) -> bool:
        """False from a failed write until the next successful one."""
        return self._healthy

    def add(self, record: Mapping[str, Any] | Any) -> None:
        """Append a record to the spool and queue it for the background writer; never blocks
        on the database. A validated dict (`validate_record`) works too and is far cheaper to
        build. After `close()` the record is written (or left in the spool) before this
        returns."""
        if self._closed:
            self._write_now(record)
            return
        if self._writer is None:
            self._ensure_writer()
        self._journal(record)
        if self._closed:  # close() drained the queue between the check and the put
            self._write_now(None)
            return
        # Wake the writer early when a full batch waits (its timer wakes it anyway).
        if self._healthy and len(self._queue) >= self.batch_size:
            self._wake.set()

    def _journal(self, record: Mapping[str, Any] | Any) -> None:
        """The spool's line first (the record survives a kill from here on), then the queue."""
        try:
            line: bytes | None = record_line(record)
        except (TypeError, ValueError):
            line = None  # not JSON: the database refuses it too, and says so (`_store`)
        with self._order_lock:
            start: int | None = None
            end = 0
            if line is not None:
                try:
                    end = self.spool.append(line)
                    start = end - len(line)
                    self._journal_failing = False
                except OSError as error:
                    self._spool_failed(error)
            if len(self._queue) < self._queue_size:
                self._queue.append((record, start, end))
            elif start is None:
                self._drop(1, "the queue is full and the spool refused the record")
            else:
                self._count("spooled", 1)  # in the file only: read back from there

    def _spool_failed(self, error: OSError) -> None:
        if not self._journal_failing:
            logger.error(
                "llm-slo: cannot append to the spool %s (%s): records are in memory only "
                "until it works again",
                self.spool.path,
                first_line(error),
            )
        self._journal_failing = True

    def _write_now(self, record: Mapping[str, Any] | Any | None) -> None:
        """Write `record` and whatever waits in the queue on this thread (the writer is gone)."""
        with self._pump_lock:
            if record is not None:
                self._journal(record)
            # While the database is out, a late record waits for the next retry no longer than
            # it takes to append it: the caller is a request, it cannot wait out a backoff.
            due = self._healthy or time.monotonic() >= self._retry_at
            self._pump(try_database=due, spill=True)
            if not self.spool.has_records:
                self.spool.close()  # nothing left: no file either

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
                    with self._pump_lock:
                        self._pump(try_database=due, spill=urgent)
                except Exception as error:  # a dead writer would hang flush() and close()
                    logger.exception("llm-slo: record writer error; retrying")
                    self._mark_down(error)
            if stopping:
                return

    def _pump(self, try_database: bool, spill: bool) -> None:
        """Replay adopted files, then drain the queue into the database, and then what only
        the file holds behind it. On an outage the queue stays the in-memory buffer, or is
        left in the file when someone waits (`spill`)."""
        up = try_database and self.replay.backlog(self.batch_size)
        queued, take = self._queue, self._queue.popleft
        while up or spill:
            with self._drained:  # taken and counted in one step: flush() sees one or the other
                batch = [take() for _ in range(min(self.batch_size, len(queued)))]
                self._holding += len(batch) + 1  # + 1: the file's tail, read below
            try:
                if up:
                    up = self._write(batch) and self._write_tail()
                else:
                    self._leave(batch)
            finally:
                with self._drained:
                    self._holding -= len(batch) + 1
                    self._drained.notify_all()
            if not batch:
                return

    def _write(self, batch: list[Item]) -> bool:
        """Insert a batch in the file's order, the lines between its records (records only the
        file holds) read back first; False when the database is out (the rest left)."""
        loose = [record for record, start, _ in batch if start is None]
        if loose:  # never in the file: inserted from here, or appended now
            stored = self._store(loose)
            self._spool(loose[stored:])
        run: list[Item] = []
        for index, item in enumerate(batch):
            _, start, end = item
            if start is None or end <= self.spool.committed:
                continue  # not in the file, or read back from it already
            if start != (run[-1][2] if run else self.spool.committed):
                if not (self._insert_run(run) and self.replay.until(start, self.batch_size)):
                    self._leave([i for i in batch[index:] if i[1] is not None])
                    return False
                run = []
            run.append(item)
        return self._insert_run(run)

    def _insert_run(self, run: list[Item]) -> bool:
        """Insert records that follow each other in the file from the committed position."""
        if not run:
            return True
        stored = self._store([record for record, _, _ in run])
        if stored:
            self.spool.commit(run[stored - 1][2])
        if stored < len(run):
            self._leave(run[stored:])
            return False
        return True

    def _write_tail(self) -> bool:
        """Once the queue is empty: what only the file holds after the last queued record."""
        with self._order_lock:  # the end of the file with nothing queued behind it
            if self._queue:
                return True
            end = self.spool.end
        return self.replay.until(end, self.batch_size)

    def _leave(self, batch: list[Item]) -> None:
        """The database is out: the batch's records wait in the file (the ones not in it are
        appended now)."""
        self._count("spooled", sum(start is not None for _, start, _ in batch))
        self._spool([record for record, start, _ in batch if start is None])

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

    def _spool(self, records: list[Any]) -> None:
        """Append records that are not in the file yet; they are read back from there."""
        for record in records:
            try:
                self.spool.append(record_line(record))
                self._count("spooled", 1)
            except (OSError, TypeError, ValueError) as error:
                self._drop(1, f"cannot spool to {self.spool.path}: {error}")

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
        with self._pump_lock:  # records that raced past `add`'s closed check
            if self._queue:
                self._pump(try_database=self._healthy, spill=True)
            left = self.spool.has_records
            self.spool.close()
        if left:
            logger.warning(
                "llm-slo: records stay in spool files under %s; the next store there replays them",
                self.spool.directory,
            )
