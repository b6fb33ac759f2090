"""The search for the highest load that passes: doubling to a bracket, then bisection, then a
confirmation of the answer.

As `vllm bench sweep serve_sla`: start where a first estimate says (the caller's saturation
probe, or a given rate), double (or halve) until one load passes and the next fails, then
bisect that bracket until it is narrower than `resolution` of its lower end. Near its
capacity a real server's steps are a draw: one short window at a load can pass while the next
at the same load fails. So the answer, the highest load below every failed one that passed,
is run again (`confirmations` more times, on fresh draws) before it is called the max; when a
confirmation fails, that load fails and the search goes on below it. A probe may also answer
None (the step tells nothing: the client fell behind its schedule), which ends the search
where it stands.

For concurrency the loads are integers: the bracket ends when its ends are neighbours or
within the resolution.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

Probe = Callable[[float], bool | None]


@dataclass
class SearchOutcome:
    best: float | None = None  # highest load that passed every run, below every failed one
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
    confirmations: int = 2  # runs of the answer beyond its first, all to pass


def find_max(probe: Probe, settings: SearchSettings) -> SearchOutcome:
    """Run `probe` at the loads the search picks; see the module docstring."""
    outcome = SearchOutcome()
    lowest = 1.0 if settings.integer else settings.floor
    runs: dict[float, list[bool]] = {}
    load = _snap(settings.start, settings.integer, lowest)
    while True:
        if outcome.steps >= settings.max_steps:
            outcome.stopped = f"the step limit ({settings.max_steps}) was reached"
            break
        passed = probe(load)
        outcome.tried.append((load, passed))
        if passed is None:
            outcome.stopped = f"the step at {load:g} was inconclusive"
            break
        runs.setdefault(load, []).append(passed)
        _bracket(outcome, runs)
        following = _next_load(outcome, runs, settings, lowest)
        if following is None:
            break
        load = following
    return outcome


def _bracket(outcome: SearchOutcome, runs: dict[float, list[bool]]) -> None:
    """The lowest load that failed any run, and the highest below it that passed every run."""
    failed = [load for load, verdicts in runs.items() if not all(verdicts)]
    outcome.lowest_failing = min(failed) if failed else None
    ceiling = outcome.lowest_failing
    passed = [
        load
        for load, verdicts in runs.items()
        if all(verdicts) and (ceiling is None or load < ceiling)
    ]
    outcome.best = max(passed) if passed else None


def _next_load(
    outcome: SearchOutcome, runs: dict[float, list[bool]], settings: SearchSettings, lowest: float
) -> float | None:
    """The next load to run, or None when the search is done (`outcome.stopped` says why,
    when it ends before its resolution)."""
    best, failing = outcome.best, outcome.lowest_failing
    if best is None:
        assert failing is not None
        if failing <= lowest:
            outcome.stopped = f"even the lowest load ({lowest:g}) failed"
            return None
        return _snap(max(failing / 2, lowest), settings.integer, lowest)
    if failing is None:
        return _snap(best * 2, settings.integer, lowest)
    if not _narrow(best, failing, settings):
        middle = _snap((best + failing) / 2, settings.integer, lowest)
        if middle not in (best, failing):
            return middle
        if _confirmed(runs[best], settings):
            outcome.stopped = f"the bracket {best:g}..{failing:g} cannot be split further"
            return None
    return None if _confirmed(runs[best], settings) else best


def _confirmed(verdicts: list[bool], settings: SearchSettings) -> bool:
    return len(verdicts) > settings.confirmations


def _narrow(low: float, high: float, settings: SearchSettings) -> bool:
    if settings.integer and high - low <= 1:
        return True
    return high - low <= settings.resolution * low


def _snap(load: float, integer: bool, lowest: float) -> float:
    if integer:
        return float(max(int(lowest), round(load)))
    return float(f"{max(load, lowest):.4g}")  # loads a person can read and type again
