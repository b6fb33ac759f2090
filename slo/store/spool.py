"""The record store's safety net: a local JSONL file for records the database cannot take now.

Each store owns one file, `llm-slo-spool-<database>-<pid>-<n>.jsonl` (`<database>`: a short
hash of the database URL), in the records' own JSONL format (what `slo bench` writes), so a
file left behind by a crash is readable by `slo check --results` and
`RecordStore.import_jsonl`. Files whose owner is gone (a dead process, or a closed store in
this one) are adopted by the next store for the same database on the same directory and
replayed before its own records.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from slo.records import FIELD_NAMES

PREFIX = "llm-slo-spool-"
_NAME = re.compile(rf"{PREFIX}(\w+)-(\d+)-(\d+)\.jsonl")
_numbers = itertools.count(1)
_owned: set[Path] = set()  # files held by open stores of this process: never adopted
_owned_lock = threading.Lock()


def record_dict(record: Any) -> dict[str, Any]:
    """A record (object or dict) as its JSONL dict: every field but the database id, no Nones."""
    values = record if isinstance(record, Mapping) else record.__dict__
    return {name: values[name] for name in FIELD_NAMES if values.get(name) is not None}


def _claim(directory: Path, key: str) -> Path:
    with _owned_lock:
        while True:
            path = directory / f"{PREFIX}{key}-{os.getpid()}-{next(_numbers)}.jsonl"
            if path not in _owned and not path.exists():
                _owned.add(path)
                return path


def _owner_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # ours: alive only while a store holds it, which `_owned` says
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


class Spool:
    """Append-only JSONL of records waiting for the database; thread-safe."""

    def __init__(self, directory: str | os.PathLike[str], key: str = "records") -> None:
        """`key` names the database: only files with the same key are adopted."""
        self.directory = Path(directory)
        self.key = key
        self.path = _claim(self.directory, key)
        self.pending = 0  # records appended to our own file and not replayed yet
        self._lock = threading.Lock()
        self._handle: IO[str] | None = None
        self._backlog: list[Path] = []  # adopted files, replayed before our own
        self._offset = 0  # how far the file being replayed has been consumed

    @property
    def has_records(self) -> bool:
        return bool(self._backlog) or self.pending > 0

    def adopt_orphans(self) -> int:
        """Take over spool files whose store is gone; returns how many."""
        try:
            candidates = sorted(self.directory.glob(f"{PREFIX}*.jsonl"))
        except OSError:
            return 0
        adopted = 0
        for path in candidates:
            match = _NAME.fullmatch(path.name)
            with _owned_lock:
                if match is None or match[1] != self.key or path in _owned:
                    continue
                if _owner_alive(int(match[2])):
                    continue
            target = _claim(self.directory, self.key)
            try:
                # rename is atomic: when two stores race for one orphan, one of them wins.
                path.rename(target)
            except OSError:
                self._release(target)
                continue
            with self._lock:
                self._backlog.append(target)
            adopted += 1
        return adopted

    def append(self, records: Iterable[Any]) -> int:
        """Write records to our file; raises OSError when even the local disk refuses."""
        lines = [json.dumps(record_dict(r), separators=(",", ":")) + "\n" for r in records]
        with self._lock:
            if self._handle is None:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._handle = self.path.open("a", encoding="utf-8")
            self._handle.write("".join(lines))
            self._handle.flush()  # a crash after this keeps them (the OS has the bytes)
            self.pending += len(lines)
        return len(lines)

    def read(self, limit: int) -> list[tuple[dict[str, Any] | None, int]]:
        """Up to `limit` records from the file being replayed, each with its end offset.

        None stands for a line that is not a record (a crash cut it short); it is consumed
        like the others so that it never blocks the rest.
        """
        with self._lock:
            while True:
                path = self._backlog[0] if self._backlog else self.path
                try:
                    handle = path.open("rb")
                except FileNotFoundError:
                    if not self._backlog:
                        return []
                    self._finish_backlog_file()
                    continue
                break
            with handle:
                handle.seek(self._offset)
                entries: list[tuple[dict[str, Any] | None, int]] = []
                while len(entries) < limit:
                    line = handle.readline()
                    if not line:
                        break
                    value: Any = None
                    with contextlib.suppress(ValueError):
                        value = json.loads(line)
                    entries.append((value if isinstance(value, dict) else None, handle.tell()))
        if not entries and self._backlog:
            with self._lock:
                self._finish_backlog_file()
            return self.read(limit)
        return entries

    def consumed(self, end_offset: int, count: int) -> None:
        """The records read up to `end_offset` are in the database: forget them."""
        with self._lock:
            self._offset = end_offset
            if self._backlog:
                with contextlib.suppress(OSError):
                    if end_offset >= self._backlog[0].stat().st_size:
                        self._finish_backlog_file()
                return
            self.pending = max(0, self.pending - count)
            with contextlib.suppress(OSError):
                if end_offset >= self.path.stat().st_size:
                    # Everything replayed and nothing new: start over with no file at all.
                    self._close_handle()
                    self.path.unlink()
                    self._offset = 0
                    self.pending = 0

    def close(self) -> None:
        """Stop writing; the file stays when it still holds records, for the next store."""
        with self._lock:
            self._close_handle()
            if self.pending == 0:
                with contextlib.suppress(OSError):
                    self.path.unlink()
            elif self._offset and not self._backlog:
                self._cut_consumed(self.path)
            if self._offset and self._backlog:
                self._cut_consumed(self._backlog[0])
            # Left-over adopted files and our file become orphans again, for the next store.
            for path in [*self._backlog, self.path]:
                self._release(path)
            self._backlog.clear()

    def _cut_consumed(self, path: Path) -> None:
        # The next store replays whole files: what is already in the database must go first.
        with contextlib.suppress(OSError):
            rest = path.read_bytes()[self._offset :]
            partial = path.with_name(path.name + ".partial")
            partial.write_bytes(rest)
            os.replace(partial, path)
        self._offset = 0

    def _finish_backlog_file(self) -> None:
        path = self._backlog.pop(0)
        with contextlib.suppress(OSError):
            path.unlink()
        self._release(path)
        self._offset = 0

    def _close_handle(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    @staticmethod
    def _release(path: Path) -> None:
        with _owned_lock:
            _owned.discard(path)
