"""Live windows shared through files: every worker's counts summed, layouts never mixed, one
elected pusher."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from middleware.live.shared import PusherElection, SharedWindowSet
from middleware.live.windows import WindowSet
from tests.helpers.hotpath import each_hotpath  # noqa: F401  (runs each test on both hot paths)

WINDOWS = [60.0, 600.0]
WIDTH = 4
NOW = 1_800_000_000.0


def _add(windows: WindowSet, now_s: float, counts: list[int]) -> None:
    amounts = np.asarray(counts, dtype=np.float64)
    columns = np.nonzero(amounts)[0]
    windows.add(now_s, columns, amounts[columns])


def test_every_worker_sees_the_sum_of_all_workers(tmp_path: Path) -> None:
    first = SharedWindowSet(tmp_path, "premium", WINDOWS, WIDTH, worker_id="1")
    second = SharedWindowSet(tmp_path, "premium", WINDOWS, WIDTH, worker_id="2")
    local = WindowSet(WINDOWS, WIDTH)  # the same traffic in one process: the reference
    for step, (counts, workers) in enumerate(
        [([1, 0, 2, 0], (first,)), ([0, 3, 0, 1], (second,)), ([2, 2, 0, 0], (first, second))]
    ):
        for worker in workers:
            _add(worker, NOW + step, counts)
            _add(local, NOW + step, counts)
    for window in WINDOWS:
        expected = local.total(window, NOW + 3)
        assert expected.sum() > 0
        for worker in (first, second):
            np.testing.assert_array_equal(worker.total(window, NOW + 3), expected)
    # Counts older than a window leave it, from every worker's file alike.
    for worker in (first, second):
        assert worker.total(60.0, NOW + 200).sum() == 0
        np.testing.assert_array_equal(worker.total(600.0, NOW + 200), local.total(600.0, NOW + 200))
    first.close()
    second.close()


def test_a_third_worker_and_a_restarted_one_see_everything_in_the_window(tmp_path: Path) -> None:
    first = SharedWindowSet(tmp_path, "premium", WINDOWS, WIDTH, worker_id="1")
    _add(first, NOW, [5, 0, 0, 0])
    first.close()
    # A worker that exited still counts: its requests happened within the window.
    late = SharedWindowSet(tmp_path, "premium", WINDOWS, WIDTH, worker_id="3")
    assert late.total(60.0, NOW + 1).tolist() == [5, 0, 0, 0]
    # The same worker id again (a restart) keeps adding to its file.
    again = SharedWindowSet(tmp_path, "premium", WINDOWS, WIDTH, worker_id="1")
    _add(again, NOW + 1, [1, 0, 0, 0])
    assert late.total(60.0, NOW + 1).tolist() == [6, 0, 0, 0]


def test_files_of_another_layout_are_never_mixed_in(tmp_path: Path) -> None:
    premium = SharedWindowSet(tmp_path, "premium", WINDOWS, WIDTH, worker_id="1")
    standard = SharedWindowSet(tmp_path, "standard", WINDOWS, WIDTH, worker_id="2")
    wider = SharedWindowSet(tmp_path, "premium", WINDOWS, WIDTH + 1, worker_id="3")
    _add(premium, NOW, [1, 1, 1, 1])
    _add(standard, NOW, [7, 0, 0, 0])
    _add(wider, NOW, [0, 0, 0, 0, 9])
    assert premium.total(60.0, NOW).tolist() == [1, 1, 1, 1]
    assert standard.total(60.0, NOW).tolist() == [7, 0, 0, 0]
    assert wider.total(60.0, NOW).tolist() == [0, 0, 0, 0, 9]


def test_one_worker_pushes_and_another_takes_over_when_it_goes(tmp_path: Path) -> None:
    first, second = PusherElection(tmp_path), PusherElection(tmp_path)
    assert first.held()
    assert not second.held()
    assert first.held()  # kept for life
    first.release()
    assert second.held()
    assert not first.held()
    second.release()
    assert PusherElection(None).held()  # one process: always the pusher


@given(
    st.lists(
        st.tuples(st.floats(0, 30), st.integers(0, WIDTH - 1), st.integers(1, 3)), max_size=40
    ),
    st.floats(0, 30),
)
def test_windows_sum_exactly_the_slots_inside_each_window(
    steps: list[tuple[float, int, int]], wait_s: float
) -> None:
    """Every window of a set (local, or in a worker's file) holds the events whose slot lies
    within its last 60 slots, as a brute-force sum over the events finds."""
    with tempfile.TemporaryDirectory() as directory:
        shared = SharedWindowSet(Path(directory), "t", [1.0, 60.0], WIDTH, worker_id="1")
        local = WindowSet([1.0, 60.0], WIDTH)
        now, events = NOW, []
        for gap, column, amount in steps:
            now += gap
            events.append((now, column, amount))
            for windows in (local, shared):
                windows.add(now, np.asarray([column]), np.asarray([float(amount)]))
        now += wait_s
        for window in (1.0, 60.0):
            slot_s = window / 60
            newest = math.floor(now / slot_s)
            expected = [0.0] * WIDTH
            for at, column, amount in events:
                if newest - 60 < math.floor(at / slot_s) <= newest:
                    expected[column] += amount
            assert local.total(window, now).tolist() == expected
            assert shared.total(window, now).tolist() == expected
