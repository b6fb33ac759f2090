"""The record store's journal: every record is a line of a local JSONL file from its `add()`.

`add()` appends the record to the store's own file, one `os.write` on an `O_APPEND` descriptor:
when it returns the line is in the kernel's page cache, which a killed process (SIGKILL, the
OOM killer) cannot take with it. The record is queued for the database too, and the writer
inserts it from memory; `commit` then marks how far the file is in the database (a position:
bytes since the store opened). Once all of it is in, the file is emptied. A busy store's file
is never all in at once, so it is cut into segments of `segment_bytes` (a new file), and a
segment goes once all of it is in. A record the queue could not hold, or whose write failed,
is read back from the file (`read`) and inserted from there.

Files are `llm-slo-spool-<database>-<pid>-<n>.jsonl` (`<database>`: a short hash of the
database URL), in the records' own JSONL format (what `slo bench` writes; null for a value
not set), so a file left behind by a crash is readable by `slo check --results` and
`RecordStore.import_jsonl`. Files whose owner is gone (a dead process, or a closed store in
this one) are adopted by the next store for the same database on the same directory
(`adopt_orphans`) and replayed before its own records. Part of such a file may already be in
the database (the kill came between an insert and its `commit`): the writer replays it by
request id and start time (`slo.store.replay`), so each record lands exactly once.

`fsync=True` opens the file with `O_DSYNC`: each append returns once the line is on the disk,
so a machine crash (power, kernel panic) loses nothing either; without it, what a crash can
lose is what the kernel had not yet written back (about 30 s of records at most, Linux's
default `dirty_expire_centisecs`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from slo.records import FIELD_NAMES

PREFIX = "llm-slo-spool-"
SEGMENT_BYTES = 4 << 20  # a file this long is followed by a new one
_NAME = re.compile(rf"{PREFIX}(\w+)-(\d+)-(\d+)\.jsonl")
_numbers = itertools.count(1)
_owned: set[Path] = set()  # files held by open stores of this process: never adopted
_owned_lock = threading.Lock()


def _plain(value: Any) -> Any:
    """A numpy scalar (a count from an array, say) as the Python number it holds."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"a record value of type {type(value).__name__} is not JSON")


_encode = msgspec.json.Encoder(enc_hook=_plain).encode
Entry = tuple[dict[str, Any] | None, int]  # a line's record (None: not one) and where it ends


def record_dict(record: Any) -> dict[str, Any]:
    """A record (object or dict) as its JSONL dict: every field but the database id, no Nones."""
    values = record if isinstance(record, Mapping) else record.__dict__
    return {name: values[name] for name in FIELD_NAMES if values.get(name) is not None}


def record_line(record: Any) -> bytes:
    """A record as one journal line. The middleware's records are plain dicts with every field:
    encoded as they are (msgspec: a few microseconds, on the request path)."""
    if type(record) is dict:
        return _encode(record) + b"\n"
    return _encode(record_dict(record)) + b"\n"


def parse_lines(data: bytes, position: int, limit: int) -> list[Entry]:
    """Up to `limit` lines of `data` (which starts at `position`), each with its end position.
    A line that is not a record (cut short by a crash: a torn write) reads as None."""
    entries: list[Entry] = []
    for line in itertools.islice(data.splitlines(keepends=True), limit):
        position += len(line)
        value: Any = None
        with contextlib.suppress(ValueError):
            value = json.loads(line)
        entries.append((value if isinstance(value, dict) else None, position))
    return entries


def _claim(directory: Path, key: str) -> Path:
    with _owned_lock:
        while True:
            path = directory / f"{PREFIX}{key}-{os.getpid()}-{next(_numbers)}.jsonl"
            if path not in _owned and not path.exists():
                _owned.add(path)
                return path


def _release(path: Path) -> None:
    with _owned_lock:
        _owned.discard(path)


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


@dataclass
class _Segment:
    path: Path
    base: int  # the position of its first byte
    end: int  # the position after its last byte


class Spool:
    """The journal of one store: its own segments, and the files it adopted; thread-safe."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        key: str = "records",
        *,
        fsync: bool = False,
        segment_bytes: int = SEGMENT_BYTES,
    ) -> None:
        """`key` names the database: only files with the same key are adopted."""
        if segment_bytes < 1:
            raise ValueError(f"spool segment_bytes {segment_bytes!r}: use a positive size")
        self.directory = Path(directory)
        self.key = key
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self.path = _claim(self.directory, key)  # the segment being appended to
        self.end = 0  # the position after the last line appended
        self.committed = 0  # every line before this position is in the database
        self._base = 0  # the position of the current segment's first byte
        self._full: list[_Segment] = []  # earlier segments, not all in the database yet
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._backlog: list[Path] = []  # adopted files, replayed before our own
        self._offset = 0  # how far the first adopted file has been replayed

    @property
    def has_records(self) -> bool:
        return bool(self._backlog) or self.committed < self.end

    # --- our own segments ----------------------------------------------------------------------

    def append(self, line: bytes) -> int:
        """Append one line (a whole record); its end position. Raises OSError when the local
        disk refuses, with nothing of the line left in the file."""
        with self._lock:
            if self._fd is None:
                self._open()
            fd = self._fd
            assert fd is not None
            try:
                written = os.write(fd, line)
                while written < len(line):  # a short write: a full disk, a signal
                    written += os.write(fd, line[written:])
            except OSError:
                # No half line may stay: the next one would be glued to it.
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, self.end - self._base)
                raise
            self.end += len(line)
            if self.end - self._base >= self.segment_bytes:
                self._rotate()
            return self.end

    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with _owned_lock:
            _owned.add(self.path)  # again, after a close
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | (os.O_DSYNC if self.fsync else 0)
        self._fd = os.open(self.path, flags, 0o644)
        if self.fsync:  # the file's name must survive a crash too
            directory = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)

    def _rotate(self) -> None:
        self._close_fd()
        self._full.append(_Segment(self.path, self._base, self.end))
        self.path = _claim(self.directory, self.key)
        self._base = self.end

    def read(self, start: int, stop: int, limit: int) -> list[Entry]:
        """Up to `limit` lines of our own segments from position `start` (a line's start) to
        `stop`, each with its end position."""
        with self._lock:
            segments = [*self._full, _Segment(self.path, self._base, self.end)]
        entries: list[Entry] = []
        for segment in segments:
            low, high = max(start, segment.base), min(stop, segment.end)
            if low >= high:
                continue
            with segment.path.open("rb") as handle:
                handle.seek(low - segment.base)
                data = handle.read(high - low)
            entries += parse_lines(data, low, limit - len(entries))
            if len(entries) >= limit:
                break
        return entries

    def commit(self, position: int) -> None:
        """Every line before `position` is in the database: files holding only such lines go,
        and the current one is emptied once all of it is in."""
        with self._lock:
            self.committed = max(self.committed, position)
            while self._full and self._full[0].end <= self.committed:
                segment = self._full.pop(0)
                with contextlib.suppress(OSError):
                    segment.path.unlink()
                _release(segment.path)
            if self.committed >= self.end > self._base and not self._full:
                with contextlib.suppress(OSError):
                    if self._fd is not None:
                        os.ftruncate(self._fd, 0)
                    else:
                        self.path.unlink()
                    self._base = self.end

    def close(self) -> None:
        """Stop writing. Files still holding records stay, for the next store (this one's
        later appends go to a new file)."""
        with self._lock:
            self._close_fd()
            segments = [*self._full, _Segment(self.path, self._base, self.end)]
            for segment in segments:
                if segment.end <= self.committed or segment.end == segment.base:
                    with contextlib.suppress(OSError):
                        segment.path.unlink()
            # Left-over adopted files and our own become orphans, for the next store.
            for path in [*self._backlog, *(segment.path for segment in segments)]:
                _release(path)
            self._backlog.clear()
            self._offset = 0
            self._full.clear()
            if self.committed < self.end:  # handed over: this store never reads them again
                self.path = _claim(self.directory, self.key)
                _release(self.path)  # claimed again when written
                self.committed = self.end
            self._base = self.end

    def _close_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    # --- adopted files -------------------------------------------------------------------------

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
                _release(target)
                continue
            with self._lock:
                self._backlog.append(target)
            adopted += 1
        return adopted

    def read_backlog(self, limit: int) -> list[Entry]:
        """Up to `limit` lines of the first adopted file not replayed yet, each with its end
        offset in that file; [] when none is left."""
        while True:
            with self._lock:
                if not self._backlog:
                    return []
                path, offset = self._backlog[0], self._offset
            entries: list[Entry] = []
            with contextlib.suppress(FileNotFoundError), path.open("rb") as handle:
                handle.seek(offset)
                for line in itertools.islice(iter(handle.readline, b""), limit):
                    entries += parse_lines(line, handle.tell() - len(line), 1)
            if entries:
                return entries
            self._finish_backlog_file()

    def backlog_consumed(self, end_offset: int) -> None:
        """The first adopted file's lines up to `end_offset` are in the database."""
        with self._lock:
            self._offset = end_offset

    def _finish_backlog_file(self) -> None:
        with self._lock:
            path = self._backlog.pop(0)
            self._offset = 0
        with contextlib.suppress(OSError):
            path.unlink()
        _release(path)
