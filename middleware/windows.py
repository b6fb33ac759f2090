"""Fixed-memory sliding windows: time-bucketed counts, one ring of slots per window length.

Each ring has 60 slots spanning its window, so a window sum is exact to within one slot
(1/60th of the window); memory does not grow with traffic, only with the number of windows.
"""

from __future__ import annotations

import math

import numpy as np

SLOTS_PER_WINDOW = 60


# The current, partly filled slot plus a full window.
NUM_SLOTS = SLOTS_PER_WINDOW + 1


def window_total(
    counts: np.ndarray, slot_ids: np.ndarray, slot_s: float, now_s: float
) -> np.ndarray:
    """Column sums of a ring's `counts` over the slots inside the window ending now."""
    newest = math.floor(now_s / slot_s)
    oldest = newest - SLOTS_PER_WINDOW + 1
    live = (slot_ids >= oldest) & (slot_ids <= newest)
    return counts[live].sum(axis=0)


class Ring:
    """Counts per time slot for `width` columns, covering the last `window_s` seconds.

    `counts` (NUM_SLOTS x width, float64) and `slot_ids` (NUM_SLOTS, int64, -1 when empty)
    may be handed in, e.g. views of a file other workers read (`middleware.live_shared`).
    """

    def __init__(
        self,
        window_s: float,
        width: int,
        counts: np.ndarray | None = None,
        slot_ids: np.ndarray | None = None,
    ) -> None:
        self.window_s = window_s
        self.slot_s = window_s / SLOTS_PER_WINDOW
        self.num_slots = NUM_SLOTS
        self.counts = np.zeros((NUM_SLOTS, width), dtype=np.float64) if counts is None else counts
        self.slot_ids = np.full(NUM_SLOTS, -1, dtype=np.int64) if slot_ids is None else slot_ids

    def add(self, now_s: float, columns: np.ndarray, amounts: np.ndarray) -> None:
        slot_id = math.floor(now_s / self.slot_s)
        row = slot_id % self.num_slots
        if self.slot_ids[row] != slot_id:
            self.counts[row] = 0.0
            self.slot_ids[row] = slot_id
        self.counts[row, columns] += amounts  # columns are unique

    def total(self, now_s: float) -> np.ndarray:
        """Column sums over the slots inside the window ending now."""
        return window_total(self.counts, self.slot_ids, self.slot_s, now_s)


class WindowSet:
    """One ring per window length, all fed the same observations."""

    def __init__(self, windows_s: list[float], width: int) -> None:
        self.rings = {window: Ring(window, width) for window in sorted(set(windows_s))}

    def add(self, now_s: float, columns: np.ndarray, amounts: np.ndarray) -> None:
        for ring in self.rings.values():
            ring.add(now_s, columns, amounts)

    def total(self, window_s: float, now_s: float) -> np.ndarray:
        return self.rings[window_s].total(now_s)
