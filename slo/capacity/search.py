"""The search for the highest load that passes: doubling to a bracket, then bisection.

As `vllm bench sweep serve_sla`: start where a first estimate says (the caller's saturation
probe, or a given rate), double (or halve) until one load passes and the next fails, then
bisect that bracket until it is narrower than `resolution` of its lower end. The answer is
the lower end: the highest load seen to pass. A probe may also answer None (the step tells
nothing: the client fell behind its schedule), which ends the search where it stands.

For concurrency the loads are integers: the bracket ends when its ends are neighbours or
within the resolution.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

Probe = Callable[[float], bool | None]


@dataclass
class SearchOutcome:
    best: float | None = None  # highest load that passed
    lowest_failing: float | None = None
    tried: list[tuple[float, bool | None]] = field(default_factory=list)
    stopped: str | None = None  # why the search ended before its resolution, if it did

    @property
    def steps(self) -> int:
        return len(self.tried)


@dataclass(frozen=True)
class SearchSettings:
    start: float
    resolution: float = 0.05
    max_steps: int = 12
    integer: bool = False
    floor: float = 1e-3  # below this load (or 1 in integer mode) halving gives up


def find_max(probe: Probe, settings: SearchSettings) -> SearchOutcome:
    """Run `probe` at the loads the search picks; see the module docstring."""
    outcome = SearchOutcome()
    lowest = 1.0 if settings.integer else settings.floor

    def run(load: float) -> bool | None:
        if outcome.steps >= settings.max_steps:
            outcome.stopped = f"the step limit ({settings.max_steps}) was reached"
            return None
        passed = probe(load)
        outcome.tried.append((load, passed))
        if passed is None:
            outcome.stopped = outcome.stopped or f"the step at {load:g} was inconclusive"
        elif passed:
            outcome.best = load if outcome.best is None else max(outcome.best, load)
        else:
            failed = outcome.lowest_failing
            outcome.lowest_failing = load if failed is None else min(failed, load)
        return passed

    load = _snap(settings.start, settings.integer, lowest)
    passed = run(load)
    while outcome.best is None or outcome.lowest_failing is None:
        if passed is None:
            return outcome
        if not passed and load <= lowest:
            outcome.stopped = f"even the lowest load ({lowest:g}) failed"
            return outcome
        load = _snap(load * 2 if passed else max(load / 2, lowest), settings.integer, lowest)
        passed = run(load)
    low, high = outcome.best, outcome.lowest_failing
    while not _narrow(low, high, settings):
        middle = _snap((low + high) / 2, settings.integer, lowest)
        if middle in (low, high):
            outcome.stopped = f"the bracket {low:g}..{high:g} cannot be split further"
            return outcome
        passed = run(middle)
        if passed is None:
            return outcome
        low, high = (middle, high) if passed else (low, middle)
    return outcome


def _narrow(low: float, high: float, settings: SearchSettings) -> bool:
    if settings.integer and high - low <= 1:
        return True
    return high - low <= settings.resolution * low


def _snap(load: float, integer: bool, lowest: float) -> float:
    if integer:
        return float(max(int(lowest), round(load)))
    return float(f"{max(load, lowest):.4g}")  # loads a person can read and type again
