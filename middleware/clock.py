"""Clocks: monotonic nanoseconds for durations, wall time for timestamps; injectable for tests."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ns(self) -> int:
        """Monotonic nanoseconds, comparable with the engine's `time.perf_counter_ns()` stamps."""
        ...

    def wall_s(self) -> float:
        """Unix seconds, for timestamps only."""
        ...


class SystemClock:
    def now_ns(self) -> int:
        return time.perf_counter_ns()

    def wall_s(self) -> float:
        return time.time()


class ScriptedClock:
    """A clock that moves only when told: exact timing tests that never sleep."""

    def __init__(self, start_ns: int = 1_000_000_000, wall_s: float = 1_800_000_000.0) -> None:
        self.ns = start_ns
        self._wall_origin_ns = start_ns
        self._wall_origin_s = wall_s

    def now_ns(self) -> int:
        return self.ns

    def wall_s(self) -> float:
        return self._wall_origin_s + (self.ns - self._wall_origin_ns) / 1e9

    def advance_ms(self, milliseconds: float) -> int:
        self.ns += round(milliseconds * 1_000_000)
        return self.ns
