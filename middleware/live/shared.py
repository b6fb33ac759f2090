"""Live SLO windows shared by every worker of one server, and one elected Alertmanager pusher.

A server started with several workers (`uvicorn --workers N`, gunicorn) is several processes,
each seeing its share of the requests. With `PROMETHEUS_MULTIPROC_DIR` set (multi-worker
servers already need it for `/metrics`), each worker keeps its windows' rings in a file of its
own under `<dir>/llm_slo_live/` (memory-mapped: a request's counts cost no more than in memory)
and every `/slo`, from any worker, sums the rings of every file: every worker's share, also of
workers that exited within the window (their requests happened). Files of another spec have
another name and are never mixed in.

Alerts are computed from the same summed windows in every worker (so a worker that takes over
holds the same `for` state), but pushed to Alertmanager by one: the holder of an exclusive
`flock` on `<dir>/llm_slo_live/alert-pusher.lock`. The kernel frees it when its holder dies and
the next worker to try takes over; nothing needs cleaning up.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import math
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from middleware.live.windows import NUM_SLOTS, SLOTS_PER_WINDOW, WindowSet, window_total

LIVE_DIR_NAME = "llm_slo_live"
SUFFIX = ".live"


def ring_series(
    counts: np.ndarray, slot_ids: np.ndarray, slot_s: float, now_s: float
) -> np.ndarray:
    """One ring's counts per slot, oldest first (SLOTS_PER_WINDOW x width): the window ending
    now as a time series. Slots nobody wrote to (or reused since) read as zeros."""
    newest = math.floor(now_s / slot_s)
    ids = np.arange(newest - SLOTS_PER_WINDOW + 1, newest + 1, dtype=np.int64)
    rows = ids % NUM_SLOTS
    series = counts[rows].copy()
    series[slot_ids[rows] != ids] = 0.0
    return series


def window_series(windows: WindowSet, window_s: float, now_s: float) -> np.ndarray:
    """`ring_series` of a window set's ring for `window_s`; every worker's for a shared set."""
    if isinstance(windows, SharedWindowSet):
        return windows.series(window_s, now_s)
    ring = windows.index[window_s]
    return ring_series(
        windows.counts[ring], windows.slot_ids[ring], float(windows.slot_s[ring]), now_s
    )


def shared_dir() -> Path | None:
    """Where the workers' live windows meet, or None for a single-process server."""
    base = os.environ.get("PROMETHEUS_MULTIPROC_DIR")  # as `MetricSet` decides multiprocess
    return Path(base) / LIVE_DIR_NAME if base else None


@contextlib.contextmanager
def _locked(fd: int, operation: int) -> Iterator[None]:
    fcntl.flock(fd, operation)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


class _RingFile:
    """One worker's rings in a file: every window's slot ids, then every window's counts
    (the arrays of `WindowSet`)."""

    def __init__(self, path: Path, windows_s: list[float], width: int, create: bool) -> None:
        shape = (len(windows_s), NUM_SLOTS)
        ids_bytes = shape[0] * NUM_SLOTS * 8
        size = ids_bytes * (1 + width)
        if create and not (path.exists() and path.stat().st_size == size):
            # Written whole under a temporary name, then renamed: a reader never maps a
            # half-made file. An existing file of the same layout (this worker id, restarted)
            # is kept: its counts are requests that happened.
            temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            empty = np.zeros(size // 8, dtype=np.int64)
            empty[: shape[0] * NUM_SLOTS] = -1
            temporary.write_bytes(empty.tobytes())
            os.replace(temporary, path)
        self.path = path
        self.fd = os.open(path, os.O_RDWR if create else os.O_RDONLY)
        try:
            if os.fstat(self.fd).st_size != size:
                raise ValueError(f"{path}: {os.fstat(self.fd).st_size} bytes, expected {size}")
            access = mmap.ACCESS_WRITE if create else mmap.ACCESS_READ
            self.map = mmap.mmap(self.fd, size, access=access)
        except BaseException:
            os.close(self.fd)
            raise
        self.slot_ids = np.ndarray(shape, np.int64, self.map, 0)
        self.counts = np.ndarray((*shape, width), np.float64, self.map, ids_bytes)
        self.index = {window: position for position, window in enumerate(windows_s)}

    def total(self, window_s: float, now_s: float) -> np.ndarray:
        ring = self.index[window_s]
        with _locked(self.fd, fcntl.LOCK_SH):
            return window_total(
                self.counts[ring], self.slot_ids[ring], window_s / SLOTS_PER_WINDOW, now_s
            )

    def series(self, window_s: float, now_s: float) -> np.ndarray:
        ring = self.index[window_s]
        with _locked(self.fd, fcntl.LOCK_SH):
            return ring_series(
                self.counts[ring], self.slot_ids[ring], window_s / SLOTS_PER_WINDOW, now_s
            )

    def close(self) -> None:
        del self.slot_ids, self.counts
        with contextlib.suppress(BufferError):  # a total still holding a view: freed with it
            self.map.close()
        os.close(self.fd)


class SharedWindowSet(WindowSet):
    """A `WindowSet` whose rings live in this worker's file; `total` adds every worker's.

    `key` names the layout (tier, columns, buckets): files of another key are never read.
    The caller serializes `add` and `total` within the process (TierWindows' lock); the file
    lock orders them against readers in other processes.
    """

    def __init__(
        self,
        directory: Path,
        key: str,
        windows_s: list[float],
        width: int,
        worker_id: str | None = None,
    ) -> None:
        self.directory = directory
        self.width = width
        windows_s = sorted(set(windows_s))
        layout = repr((key, windows_s, width, SLOTS_PER_WINDOW))
        self.prefix = hashlib.sha256(layout.encode()).hexdigest()[:16]
        self._worker_id = worker_id
        self._peers: dict[Path, _RingFile] = {}
        directory.mkdir(parents=True, exist_ok=True)
        super().__init__(windows_s, width)  # the arrays are replaced by the file's views
        self._attach()

    def _attach(self) -> None:
        """Open this worker's file and put the rings on it (again after a fork: a child must
        not write into its parent's file)."""
        self._pid = os.getpid()
        worker = self._worker_id or str(self._pid)
        self.own = _RingFile(
            self.directory / f"{self.prefix}-{worker}{SUFFIX}", self.windows_s, self.width, True
        )
        self.counts, self.slot_ids = self.own.counts, self.own.slot_ids

    def add(self, now_s: float, columns: np.ndarray, amounts: np.ndarray) -> None:
        if os.getpid() != self._pid:
            self._attach()
        with _locked(self.own.fd, fcntl.LOCK_EX):
            super().add(now_s, columns, amounts)

    def total(self, window_s: float, now_s: float) -> np.ndarray:
        total = super().total(window_s, now_s)
        for peer in self._peer_files():
            total = total + peer.total(window_s, now_s)
        return total

    def series(self, window_s: float, now_s: float) -> np.ndarray:
        """Every worker's counts per slot of the window ending now (`ring_series`)."""
        series = self.own.series(window_s, now_s)
        for peer in self._peer_files():
            series = series + peer.series(window_s, now_s)
        return series

    def _peer_files(self) -> list[_RingFile]:
        paths = set(self.directory.glob(f"{self.prefix}-*{SUFFIX}"))
        paths.discard(self.own.path)
        for gone in set(self._peers) - paths:  # removed by hand: forget it
            self._peers.pop(gone).close()
        for path in paths - set(self._peers):
            with contextlib.suppress(OSError, ValueError):  # vanished or not ours: skip it
                self._peers[path] = _RingFile(path, self.windows_s, self.width, False)
        return list(self._peers.values())

    def close(self) -> None:
        for peer in self._peers.values():
            peer.close()
        self._peers.clear()


class PusherElection:
    """Whether this worker is the one that pushes alerts: it holds the pusher lock.

    With no shared directory (one process) it always is. Otherwise the first worker to take
    the lock keeps it for its life; the others try again at every push.
    """

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self._fd: int | None = None
        self._pid = os.getpid()

    def held(self) -> bool:
        if self.directory is None:
            return True
        if self._fd is not None and os.getpid() == self._pid:
            return True
        if self._fd is not None:  # a forked child: the right to push stays with the parent
            os.close(self._fd)
        self._pid = os.getpid()
        self._fd = None
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / "alert-pusher.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor releases the lock
            self._fd = None
