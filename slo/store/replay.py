"""Records read back from spool files into the database, each exactly once.

A line is read back when the database never got it from memory (the queue was full, its batch
failed) or when it is in a file a killed store left behind. Either way the database may hold it
already: a kill between an insert and its `commit` in the spool, or a commit whose answer was
lost with the connection. So the lines are inserted by key, (request id, start time): a record
whose key the database holds is skipped, one whose key it lacks is inserted. The key is an
indexed column and a value that cannot change, on SQLite and on PostgreSQL alike, and needs no
unique constraint on a table that older releases (or imports) may have filled with
duplicates. Two records of one store with the same request id and start time would be told
apart by nothing; the middleware's request ids never repeat.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from slo.store.spool import Entry, Spool

logger = logging.getLogger("slo.store")

Key = tuple[Any, Any]  # (request_id, timestamp)


class Replay:
    def __init__(
        self,
        spool: Spool,
        store: Callable[[list[Any]], int],
        find_stored: Callable[[list[Key]], set[Key]],
        count: Callable[[str, int], None],
        mark_down: Callable[[BaseException], None],
    ) -> None:
        """`store` inserts records and says how many from the front are done (the writer's
        `_store`); `find_stored`: the keys among these the database holds."""
        self.spool = spool
        self._store = store
        self._find_stored = find_stored
        self._count = count
        self._mark_down = mark_down

    def backlog(self, limit: int) -> bool:
        """Replay the files adopted from stores that are gone; False when the database is out."""
        while True:
            entries = self.spool.read_backlog(limit)
            if not entries:
                return True
            done = self._insert(entries)
            if done:
                self.spool.backlog_consumed(entries[done - 1][1])
            if done < len(entries):
                return False

    def until(self, stop: int, limit: int) -> bool:
        """Replay our own file from its committed position to `stop`; False when the database
        is out."""
        spool = self.spool
        while spool.committed < stop:
            try:
                entries = spool.read(spool.committed, stop, limit)
            except OSError as error:
                entries = []
                logger.error("llm-slo: cannot read the spool under %s: %s", spool.directory, error)
            if not entries:  # the file is gone or cut: nothing left to read back
                logger.error("llm-slo: spool lines %d to %d are lost", spool.committed, stop)
                spool.commit(stop)
                return True
            done = self._insert(entries)
            if done:
                spool.commit(entries[done - 1][1])
            if done < len(entries):
                return False
        return True

    def _insert(self, entries: list[Entry]) -> int:
        """Insert the records of these lines the database lacks; how many lines from the
        front are done."""
        holders = [index for index, (record, _) in enumerate(entries) if record is not None]
        records = [entries[index][0] for index in holders]
        done = self._insert_new(records)
        lines = len(entries) if done == len(records) else holders[done]
        unreadable = lines - sum(index < lines for index in holders)
        if unreadable:
            logger.error(
                "llm-slo: dropped %d unreadable lines (cut short by a crash) of a spool file "
                "under %s",
                unreadable,
                self.spool.directory,
            )
            self._count("dropped", unreadable)
        self._count("replayed", done)
        return lines

    def _insert_new(self, records: list[Any]) -> int:
        """Insert the records whose key the database lacks; how many from the front are done."""
        keys: list[Key] = [(r.get("request_id"), r.get("timestamp")) for r in records]
        try:
            present = self._find_stored([key for key in keys if key[0] is not None])
        except Exception as error:  # the database is out (or the read is refused): later
            self._mark_down(error)
            return 0
        fresh = [index for index, key in enumerate(keys) if key not in present]
        stored = self._store([records[index] for index in fresh])
        return len(records) if stored == len(fresh) else fresh[stored]
