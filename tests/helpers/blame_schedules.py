"""Driving the scheduler as the worker does, on a scripted clock, beside a plain reference of
the blame rules (docs/blame.md) computed eagerly, request by request and step by step: the
ledger's lazy figures must equal it.

Needs torch (the engine imports it): import this after `pytest.importorskip("torch")`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engine.blame import RequestBlame
from engine.scheduler import Scheduler, StepPlan
from engine.sequence import Sequence
from tests.helpers.scheduler_steps import run_plan

NS = 1e-9
Composition = list[tuple[str, int, int]]  # (request id, priority, tokens) a step ran


@dataclass
class Expected:
    """What the rules give one request, computed the plain way."""

    priority: int
    enqueue_ns: int
    schedule_ns: int | None = None  # its first schedule mark
    queue: dict[tuple[str | None, int | None], float] = field(default_factory=dict)
    interference: dict[tuple[str, int], float] = field(default_factory=dict)
    preempted_ns: int | None = None
    preempted_s: float = 0.0
    decode_s: float = 0.0
    decode_only_s: float = 0.0

    def add(self, table: dict, key: tuple, seconds: float) -> None:  # type: ignore[type-arg]
        if seconds > 0:
            table[key] = table.get(key, 0.0) + seconds


@dataclass
class _Segment:
    start_ns: int
    end_ns: int | None
    ran: Composition


class ScriptedEngine:
    """A worker's steps on a scripted clock: arrivals, plans, finishes and aborts at the times
    given, each request's blame kept when it ends (`blames`) beside its `expected`."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.expected: dict[str, Expected] = {}
        self.blames: dict[str, RequestBlame] = {}
        self._segments = [_Segment(0, None, [])]

    # ----------------------------------------------------------------------- the events
    def arrive(self, sequence: Sequence, at_ns: int) -> None:
        sequence.arrival_ns = sequence.queued_ns = at_ns
        self.scheduler.add(sequence)
        self.expected[sequence.request_id] = Expected(sequence.priority, at_ns)

    def abort(self, sequence: Sequence, at_ns: int) -> None:
        """Cancelled at `at_ns`, before the next step is planned (as the worker does)."""
        self.scheduler.remove(sequence)
        self._end_wait(sequence, at_ns)
        self._close(sequence, at_ns)

    def step(
        self,
        started_ns: int,
        plan_ns: int,
        finished_ns: int,
        finish_at: Callable[[Sequence], int] | None = None,
    ) -> StepPlan:
        """One step: planned at `plan_ns`, ending at `finished_ns`; a request it finishes ends
        at `finish_at(sequence)` (default: the step's end)."""
        scheduler = self.scheduler
        plan = scheduler.schedule(plan_ns, started_ns)
        self._next_segment(plan_ns, _composition(plan))
        for sequence in plan.preempted:
            self.expected[sequence.request_id].preempted_ns = plan_ns
        for sequence in plan.admitted:
            self._end_wait(sequence, plan_ns)
        for sequence, _ in plan.shed:
            self._end_wait(sequence, plan_ns)
            self._close(sequence, plan_ns)
        model = scheduler.blame.step_time if scheduler.blame is not None else None
        decode_only = None
        if plan.chunks and plan.decodes and model is not None and model.ready:
            decode_only = model.base_s + model.per_decode_s * len(plan.decodes)
        decoders = list(plan.decodes)
        finished = run_plan(scheduler, plan)
        ends = {id(s): (finish_at(s) if finish_at else finished_ns) for s in finished}
        for sequence in decoders:
            end = ends.get(id(sequence), finished_ns)
            self._charge(sequence, plan, (end - started_ns) * NS, decode_only)
        for sequence in finished:
            self._close(sequence, ends[id(sequence)])
        scheduler.step_finished(plan, (finished_ns - started_ns) * NS, finished_ns)
        if not scheduler.has_work():
            self._next_segment(finished_ns, [])
        return plan

    # -------------------------------------------------------------------- the reference
    def _next_segment(self, at_ns: int, ran: Composition) -> None:
        self._segments[-1].end_ns = at_ns
        self._segments.append(_Segment(at_ns, None, ran))

    def _end_wait(self, sequence: Sequence, at_ns: int) -> None:
        expected = self.expected[sequence.request_id]
        if expected.preempted_ns is not None:
            expected.preempted_s += (at_ns - expected.preempted_ns) * NS
            expected.preempted_ns = None
        elif expected.schedule_ns is None:
            expected.schedule_ns = at_ns
            self._blame_queue(expected, expected.enqueue_ns, at_ns)

    def _blame_queue(self, expected: Expected, from_ns: int, to_ns: int) -> None:
        """Every segment's share of [from_ns, to_ns), by the tokens its step gave each."""
        covered = 0
        for segment in self._segments:
            end = to_ns if segment.end_ns is None else min(segment.end_ns, to_ns)
            start = max(segment.start_ns, from_ns)
            if end <= start:
                continue
            covered += end - start
            total = sum(tokens for _, _, tokens in segment.ran)
            if not total:
                expected.add(expected.queue, (None, None), (end - start) * NS)
            for request_id, priority, tokens in segment.ran:
                share = (end - start) * NS * tokens / total
                expected.add(expected.queue, (request_id, priority), share)
        expected.add(expected.queue, (None, None), (to_ns - from_ns - covered) * NS)

    def _charge(
        self, sequence: Sequence, plan: StepPlan, seconds: float, decode_only: float | None
    ) -> None:
        expected = self.expected[sequence.request_id]
        if sequence.request_id in self.blames:
            return  # ended earlier
        expected.decode_s += seconds
        if decode_only is None or decode_only >= seconds:
            expected.decode_only_s += seconds
            return
        expected.decode_only_s += decode_only
        tokens = plan.prefill_tokens
        for chunk, count in plan.chunks:
            key = (chunk.request_id, chunk.priority)
            expected.add(expected.interference, key, (seconds - decode_only) * count / tokens)

    def _close(self, sequence: Sequence, at_ns: int) -> None:
        blame = self.scheduler.close_blame(sequence, at_ns)
        assert blame is not None, sequence.request_id
        self.blames[sequence.request_id] = blame


def _composition(plan: StepPlan) -> Composition:
    ran = [(s.request_id, s.priority, 1) for s in plan.decodes]
    return ran + [(s.request_id, s.priority, count) for s, count in plan.chunks]


def by_tier(blame: RequestBlame, cause: str) -> dict[int | None, float]:
    """Seconds per culprit priority of one cause."""
    return {priority: s for c, priority, s, _ in blame.by_tier if c == cause}


def expected_by_tier(table: dict[tuple[str | None, int | None], float]) -> dict[int | None, float]:
    totals: dict[int | None, float] = {}
    for (_, priority), seconds in table.items():
        totals[priority] = totals.get(priority, 0.0) + seconds
    return totals
