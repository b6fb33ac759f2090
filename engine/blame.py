"""Who made a request wait: the scheduler's exact blame for each request (docs/blame.md).

Three causes, each split over the requests that caused it (its culprits) and their tiers:

- `queue`: the request's first wait, from joining the queue (its arrival: the enqueue mark) to
  being scheduled (the schedule mark, the step's plan instant). The engine's time is cut at
  every step's plan instant into segments; a segment belongs to the step planned at its start
  and is split among the requests that step ran (its decodes and prefill chunks) in
  proportion to the tokens each was given in it. A segment whose step ran nothing (the
  engine idle until this request came) is blamed on nobody (culprit None). The parts sum to
  the wait.
- `interference`: each decode step the request took part in costs what a decode-only step of
  the same batch costs (the step-time model: base + per decode x decodes, the one the slo
  policy learns, `PrefillTimeModel`), at most the step's wall time; the rest, in a step that
  also ran prefill chunks, is interference, split among the chunks by their tokens.
  decode-only + interference = the wall time of its decode steps (`decode_s`: from each
  step's start to its end, or to the request's end in the step that finished it).
- `preemption`: from being preempted to being scheduled again, all of it blamed on the request
  it was preempted for (the waiting request that took its place, or the decode that needed
  its blocks).

The per-step cost stays O(batch): queue blame is lazy. While anyone waits, each culprit
accumulates `share_s`, the seconds of segments it was given; a wait keeps the culprits'
`share_s` as they stood when it joined (one dict per step with arrivals, of the unfinished
culprits) and takes the difference when it ends, for the culprits that ran since (the
culprits in order of the last segment they ran in). While nobody waits, nothing accumulates.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.policies.prefill_time import PrefillTimeModel

if TYPE_CHECKING:
    from engine.scheduler import StepPlan
    from engine.sequence import Sequence

QUEUE, INTERFERENCE, PREEMPTION = "queue", "interference", "preemption"
# slo.engine_slis.DELAY_CAUSES restates them (the core imports no engine);
# tests/unit/engine/test_blame.py fails when the two disagree.
BLAME_CAUSES: tuple[str, ...] = (QUEUE, INTERFERENCE, PREEMPTION)
TOP_CULPRITS = 3  # the record keeps this many culprit requests, and every tier's total
_NS = 1e-9
_KEPT_SEGMENTS = 4  # closed segments kept for the waits of requests not yet planned


@dataclass(frozen=True, slots=True)
class RequestBlame:
    """What caused one request's waits, handed over with its last hook event (`on_blame`)."""

    priority: int  # the request's own
    queue_s: float  # its first wait: enqueue mark to schedule mark
    preempted_s: float  # preempted until scheduled again, every time
    decode_s: float  # wall time of the decode steps it took part in
    decode_only_s: float  # what decode-only steps of the same batches cost
    interference_s: float  # decode_s - decode_only_s: the prefill chunks beside it
    # (cause, culprit priority (None: nothing ran), seconds, culprit requests) per tier.
    by_tier: tuple[tuple[str, int | None, float, int], ...]
    # (cause, culprit request id, culprit priority, seconds): the largest TOP_CULPRITS.
    top: tuple[tuple[str, str, int, float], ...]


@dataclass(eq=False, slots=True)
class SequenceBlame:
    """One request's blame while it is in the scheduler, as a victim and as a culprit."""

    request_id: str
    priority: int
    queued_ns: int
    # As a culprit: seconds of segments its steps were given while anyone waited.
    share_s: float = 0.0
    last_segment: int = -1  # the last segment it ran in, while anyone waited
    # Its first wait: open until scheduled; (segment joined, culprits' share_s then, idle_s).
    waiting: bool = True
    join: tuple[int, dict[SequenceBlame, float], float] | None = None
    preempted_ns: int | None = None
    preempted_for: SequenceBlame | None = None
    closed: bool = False
    queue_s: float = 0.0
    preempted_s: float = 0.0
    decode_s: float = 0.0
    decode_only_s: float = 0.0
    caused: dict[tuple[str, SequenceBlame | None], float] = field(default_factory=dict)

    def add(self, cause: str, culprit: SequenceBlame | None, seconds: float) -> None:
        if seconds > 0:
            key = (cause, culprit)
            self.caused[key] = self.caused.get(key, 0.0) + seconds

    def result(self) -> RequestBlame:
        """The bounded summary: every tier's total per cause, and the largest culprits."""
        tiers: dict[tuple[str, int | None], list[float]] = {}
        for (cause, culprit), seconds in self.caused.items():
            entry = tiers.setdefault((cause, culprit and culprit.priority), [0.0, 0])
            entry[0] += seconds
            entry[1] += culprit is not None
        order = {cause: place for place, cause in enumerate(BLAME_CAUSES)}
        by_tier = tuple(
            (cause, priority, seconds, int(count))
            for (cause, priority), (seconds, count) in sorted(
                tiers.items(), key=lambda item: (order[item[0][0]], _tier_key(item[0][1]))
            )
        )
        largest = heapq.nlargest(
            TOP_CULPRITS,
            (
                (seconds, culprit.request_id, cause, culprit.priority)
                for (cause, culprit), seconds in self.caused.items()
                if culprit is not None
            ),
        )
        top = tuple((cause, request, priority, s) for s, request, cause, priority in largest)
        return RequestBlame(
            self.priority,
            self.queue_s,
            self.preempted_s,
            self.decode_s,
            self.decode_only_s,
            self.decode_s - self.decode_only_s,
            by_tier,
            top,
        )


def _tier_key(priority: int | None) -> tuple[bool, int]:
    return (priority is None, priority or 0)


@dataclass(slots=True)
class _Segment:
    """The time from one plan instant to the next (or to the engine going idle), and the
    step planned at its start (None: nothing ran)."""

    index: int
    start_ns: int
    end_ns: int | None = None  # None while open
    plan: StepPlan | None = None
    num_speculative: int = 0
    _shares: list[tuple[SequenceBlame, float]] | None = None

    def shares(self) -> list[tuple[SequenceBlame, float]]:
        """Each request the step ran, with its fraction of the step's tokens (made once, when
        first asked for: most steps nobody waits and nobody asks)."""
        if self._shares is None:
            plan, spec = self.plan, self.num_speculative
            weights: list[tuple[Sequence, int]] = []
            if plan is not None:
                weights = [(s, 1 + s.lookahead(spec) if spec else 1) for s in plan.decodes]
                weights += plan.chunks
            total = sum(tokens for _, tokens in weights)
            self._shares = [(s.blame, tokens / total) for s, tokens in weights if total]
        return self._shares


class BlameLedger:
    """The scheduler's record of who caused each request's waits. Worker thread only."""

    def __init__(self, num_speculative: int = 0) -> None:
        # Its own fit of the step time, on the same steps as the slo policy's.
        self.step_time = PrefillTimeModel()
        self.num_speculative = num_speculative
        self._index = 0
        self._open = _Segment(0, 0)  # before the first plan nothing ran
        self._closed: deque[_Segment] = deque(maxlen=_KEPT_SEGMENTS)
        self._idle_s = 0.0  # seconds of segments that ran nothing, while anyone waited
        self._pending: list[SequenceBlame] = []  # joined since the last plan instant
        self._waiting = 0  # first waits joined and still open
        self._joins: dict[int, int] = {}  # segment -> first waits that joined then, open
        self._alive: dict[SequenceBlame, None] = {}  # culprits with a share, unfinished
        self._recent: dict[SequenceBlame, None] = {}  # culprits by their last segment
        self._plan: StepPlan | None = None  # the step planned and not finished yet
        self._step_started_ns = 0
        self._decode_only_s: float | None = None  # its decode-only cost (None: not known)

    # ------------------------------------------------------------------ the scheduler's events
    def joined(self, sequence: Sequence) -> None:
        """A request joined the queue (it waits from `sequence.queued_ns`)."""
        state = SequenceBlame(sequence.request_id, sequence.priority, sequence.queued_ns)
        sequence.blame = state
        self._pending.append(state)

    def plan_started(self, now_ns: int, started_ns: int) -> None:
        """A step is planned at `now_ns` (it started at `started_ns`): a new segment."""
        self._step_started_ns = started_ns
        self._next_segment(now_ns)
        if self._pending:
            self._join_pending(now_ns)

    def preempted(self, victim: Sequence, for_sequence: Sequence, now_ns: int) -> None:
        state = victim.blame
        state.preempted_ns, state.preempted_for = now_ns, for_sequence.blame

    def wait_ended(self, sequence: Sequence, now_ns: int) -> None:
        """Scheduled (or shed) at `now_ns`: its first wait, or its preemption, ends."""
        state = sequence.blame
        if state.preempted_ns is not None:
            seconds = (now_ns - state.preempted_ns) * _NS
            state.preempted_s += seconds
            state.add(PREEMPTION, state.preempted_for, seconds)
            state.preempted_ns = state.preempted_for = None
        elif state.waiting:
            self._end_first_wait(state, now_ns)

    def planned(self, plan: StepPlan) -> None:
        """The step planned at the open segment's start runs `plan`."""
        self._open.plan, self._open.num_speculative = plan, self.num_speculative
        self._plan = plan
        model = self.step_time
        self._decode_only_s = None
        if plan.chunks and plan.decodes and model.ready:
            model.fit_now()  # fitted only for the steps that ask
            self._decode_only_s = model.base_s + model.per_decode_s * len(plan.decodes)

    def step_finished(
        self, plan: StepPlan, step_s: float, finished_ns: int | None, idle: bool
    ) -> None:
        """The step ran in `step_s`; `idle`: nothing is left to schedule after it."""
        if plan.decodes:
            self._charge_decodes(plan, plan.decodes, step_s)
        if plan.chunks or plan.decodes:
            self.step_time.observe(plan.prefill_tokens, step_s, len(plan.decodes), fit=False)
        self._plan = None
        if idle and finished_ns is not None:
            self._next_segment(finished_ns)

    def close(self, sequence: Sequence, now_ns: int) -> RequestBlame | None:
        """The request ended at `now_ns`: its blame, final (None: it had none, or was closed)."""
        state: SequenceBlame | None = sequence.blame
        if state is None or state.closed:
            return None
        self.wait_ended(sequence, now_ns)
        plan = self._plan
        if plan is not None and sequence in plan.decodes:  # it ended inside its step
            self._charge_decodes(plan, [sequence], max(0, now_ns - self._step_started_ns) * _NS)
        state.closed = True
        self._alive.pop(state, None)
        return state.result()

    # ------------------------------------------------------------------------- segments
    def _next_segment(self, now_ns: int) -> None:
        """Close the open segment at `now_ns` (crediting its requests, if anyone waits), open
        the next one."""
        segment = self._open
        segment.end_ns = now_ns
        self._closed.append(segment)
        if self._waiting:
            seconds = (now_ns - segment.start_ns) * _NS
            shares = segment.shares()
            if not shares:
                self._idle_s += seconds
            recent, alive, index = self._recent, self._alive, segment.index
            for culprit, share in shares:
                culprit.share_s += seconds * share
                culprit.last_segment = index
                recent.pop(culprit, None)
                recent[culprit] = None
                if not culprit.closed:
                    alive[culprit] = None
        self._index += 1
        self._open = _Segment(self._index, now_ns)

    def _join_pending(self, now_ns: int) -> None:
        """Requests that joined since the last plan instant: what they waited until now is
        blamed at once; from now on they wait lazily, from one snapshot of the culprits."""
        joining = [state for state in self._pending if state.waiting]
        self._pending.clear()
        if not joining:
            return
        snapshot = {culprit: culprit.share_s for culprit in self._alive}
        index = self._index
        for state in joining:
            self._blame_segments(state, state.queued_ns, now_ns)
            state.join = (index, snapshot, self._idle_s)
        self._joins[index] = self._joins.get(index, 0) + len(joining)
        self._waiting += len(joining)

    def _blame_segments(self, state: SequenceBlame, from_ns: int, to_ns: int) -> None:
        """Blame [from_ns, to_ns) on the segments it overlaps, at once; time before the
        segments kept (or before the first plan) is nobody's."""
        covered = 0
        for segment in (*self._closed, self._open):
            end = to_ns if segment.end_ns is None else min(segment.end_ns, to_ns)
            start = max(segment.start_ns, from_ns)
            if end <= start:
                continue
            covered += end - start
            seconds = (end - start) * _NS
            shares = segment.shares()
            if not shares:
                state.add(QUEUE, None, seconds)
            for culprit, share in shares:
                state.add(QUEUE, culprit, seconds * share)
        state.add(QUEUE, None, (to_ns - from_ns - covered) * _NS)

    def _end_first_wait(self, state: SequenceBlame, now_ns: int) -> None:
        state.waiting = False
        state.queue_s = max(0, now_ns - state.queued_ns) * _NS
        if state.join is None:  # no plan since it joined: all of it now
            self._blame_segments(state, state.queued_ns, now_ns)
            return
        index, snapshot, idle_s = state.join
        state.join = None
        for culprit in reversed(self._recent):
            if culprit.last_segment < index:
                break
            state.add(QUEUE, culprit, culprit.share_s - snapshot.get(culprit, 0.0))
        state.add(QUEUE, None, self._idle_s - idle_s)
        self._blame_segments(state, self._open.start_ns, now_ns)  # inside the open segment
        self._leave(index)

    def _leave(self, index: int) -> None:
        """A first wait that joined at segment `index` ended: forget what no wait needs."""
        joins = self._joins
        joins[index] -= 1
        if not joins[index]:
            del joins[index]
        self._waiting -= 1
        if not self._waiting:  # nobody waits: every share starts again from zero
            for culprit in self._alive:
                culprit.share_s = 0.0
            self._alive.clear()
            self._recent.clear()
            self._idle_s = 0.0
            return
        oldest = next(iter(joins))  # joins are made in segment order
        recent = self._recent
        while recent:
            culprit = next(iter(recent))
            if culprit.last_segment >= oldest:
                break
            del recent[culprit]

    def _charge_decodes(self, plan: StepPlan, decoders: list[Sequence], seconds: float) -> None:
        """`seconds` of the step decoded each of `decoders`: its decode-only cost, and the
        rest as the step's prefill chunks' interference, by their tokens."""
        decode_only = self._decode_only_s
        if decode_only is None or decode_only >= seconds:
            for sequence in decoders:
                state = sequence.blame
                if not state.closed:
                    state.decode_s += seconds
                    state.decode_only_s += seconds
            return
        interference = seconds - decode_only
        tokens = plan.prefill_tokens
        parts = [(chunk.blame, interference * count / tokens) for chunk, count in plan.chunks]
        for sequence in decoders:
            state = sequence.blame
            if state.closed:
                continue
            state.decode_s += seconds
            state.decode_only_s += decode_only
            for culprit, amount in parts:
                state.add(INTERFERENCE, culprit, amount)
