"""Which burn-rate alerts the generated rules fire at an evaluation, from per-step counts: the
model the generated burn-rate tests (`alerts.burn_tests`) expect promtool to agree with.

A window's counts are the ones its recording rule adds up (`alerts.records`), not an ideal
`increase()`: at an evaluation at `t` a window of `W`

- read from raw series counts the events in (t - W, t];
- made of tiles of `T` (5 minutes, or an hour past 6h) counts the tiles recorded at the
  multiples of `T` in (t - W, t], that is the events in (ceil_T(t - W), floor_T(t)]: at a
  whole step the same count, between steps a window that ends at the last step and lost
  its first tile's worth (the lag `docs/alerts.md` describes).

Counts are exact: every series starts at 0 at t=0 with a sample every `sample_s`, each window
and check time is a multiple of it, and Prometheus 2.x then neither extrapolates `increase()`
nor misses a sample. Whether a rule fires on those counts is `AlertRule.fires`, the one
definition the live judge calls too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from alerts.records import tile_of
from slo.alert_rules import AlertRule


@dataclass(frozen=True)
class Counts:
    """Good and bad events per sample step of one objective; step k covers (k-1, k] samples."""

    good: tuple[int, ...]
    bad: tuple[int, ...]
    sample_s: float
    _good_sums: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _bad_sums: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_good_sums", (0, *accumulate(self.good)))
        object.__setattr__(self, "_bad_sums", (0, *accumulate(self.bad)))

    def between(self, start_s: float, end_s: float) -> tuple[int, int]:
        """(bad, events) of the steps that end in (start_s, end_s]."""
        last = len(self.good)
        first = min(last, max(0, math.floor(start_s / self.sample_s + 1e-9)))
        end = min(last, max(0, math.floor(end_s / self.sample_s + 1e-9)))
        if end <= first:
            return 0, 0
        bad = self._bad_sums[end] - self._bad_sums[first]
        return bad, bad + self._good_sums[end] - self._good_sums[first]

    def window(self, window_s: float, at_s: float) -> tuple[int, int]:
        """(bad, events) the recorded window of `window_s` holds at an evaluation at `at_s`."""
        tile = tile_of(window_s)
        if tile is None:
            return self.between(at_s - window_s, at_s)
        start = tile * math.ceil((at_s - window_s) / tile - 1e-9)
        return self.between(start, tile * math.floor(at_s / tile + 1e-9))


def fires(rule: AlertRule, counts: Counts, at_s: float) -> bool:
    """Whether the burn-rate `rule` fires at an evaluation at `at_s` on `counts`."""
    return rule.fires([counts.window(window, at_s) for window in rule.counted_windows_s])


def firing(
    rules: Sequence[tuple[AlertRule, Counts]], at_s: float, alertname: str
) -> list[AlertRule]:
    """The rules named `alertname` among `rules` (each with its objective's counts) that fire
    at `at_s`, in the order given."""
    return [rule for rule, counts in rules if rule.name == alertname and fires(rule, counts, at_s)]


def changes(rules: Sequence[tuple[AlertRule, Counts]], grid_s: float, end_s: float) -> list[float]:
    """Every evaluation where some rule starts or stops firing, with the evaluation before it:
    the checks that pin when each alert comes and goes."""
    times: set[float] = set()
    before = [False] * len(rules)
    steps = round(end_s / grid_s)
    for step in range(1, steps + 1):
        now = [fires(rule, counts, step * grid_s) for rule, counts in rules]
        if now != before:
            times.update({step * grid_s, (step - 1) * grid_s} - {0.0})
        before = now
    return sorted(times)
