"""Fixed-memory sliding windows: time-bucketed counts, one ring of slots per window length.

Each ring has 60 slots spanning its window, so a window sum is exact to within one slot
(1/60th of the window); memory does not grow with traffic, only with the number of windows.
The rings of a `WindowSet` sit in one array, so an observation updates every window in a few
numpy operations (a spec with eight windows would otherwise pay eight rounds of them), or one
typed loop where the hot path is compiled (`middleware.hotpath.window_add`).
"""

from __future__ import annotations

import math

import numpy as np

import middleware.hotpath as hotpath
from middleware.ring import NUM_SLOTS, SLOTS_PER_WINDOW


def window_total(
    counts: np.ndarray, slot_ids: np.ndarray, slot_s: float, now_s: float
) -> np.ndarray:
    """Column sums of one ring's `counts` over the slots inside the window ending now."""
    newest = math.floor(now_s / slot_s)
    oldest = newest - SLOTS_PER_WINDOW + 1
    live = (slot_ids >= oldest) & (slot_ids <= newest)
    return counts[live].sum(axis=0)


class WindowSet:
    """One ring per window length, all fed the same observations.

    `counts` (windows x NUM_SLOTS x width, float64) and `slot_ids` (windows x NUM_SLOTS,
    int64, -1 when empty), windows in ascending order, may be handed in: views of a file other
    workers read (`middleware.live.shared`).
    """

    def __init__(
        self,
        windows_s: list[float],
        width: int,
        counts: np.ndarray | None = None,
        slot_ids: np.ndarray | None = None,
    ) -> None:
        self.windows_s = sorted(set(windows_s))
        self.index = {window: position for position, window in enumerate(self.windows_s)}
        self.slot_s = np.asarray(self.windows_s, dtype=np.float64) / SLOTS_PER_WINDOW
        size = len(self.windows_s)
        self.counts = np.zeros((size, NUM_SLOTS, width), np.float64) if counts is None else counts
        self.slot_ids = np.full((size, NUM_SLOTS), -1, np.int64) if slot_ids is None else slot_ids

    def add(self, now_s: float, columns: np.ndarray, amounts: np.ndarray) -> None:
        """Add `amounts` to `columns` (unique) in the current slot of every window."""
        # Per request and tier: compiled where built (`middleware.hotpath.window_add`).
        hotpath.window_add(self.counts, self.slot_ids, self.slot_s, now_s, columns, amounts)

    def total(self, window_s: float, now_s: float) -> np.ndarray:
        ring = self.index[window_s]
        return window_total(self.counts[ring], self.slot_ids[ring], float(self.slot_s[ring]), now_s)
