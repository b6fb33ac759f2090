"""Driving the scheduler step by step with no model: sequences made by hand, and a plan
"computed" by moving each sequence's counters, so every decision is exact.

Needs torch (the engine imports it): import this after `pytest.importorskip("torch")`.
"""

from __future__ import annotations

from engine.sampling import SamplingParams
from engine.scheduler import Scheduler, StepPlan
from engine.sequence import Sequence

BLOCK = 4
SECOND = 1_000_000_000


def make_sequence(
    name: str, priority: int, prompt_tokens: int, arrival: int, now_ns: int, max_tokens: int = 4
) -> Sequence:
    sequence = Sequence(
        request_id=name,
        prompt_ids=[1] * prompt_tokens,
        params=SamplingParams(max_tokens=max_tokens, temperature=0),
        priority=priority,
        arrival=arrival,
        detokenizer=None,  # type: ignore[arg-type]  # never detokenized here
        deliver=lambda _: None,
    )
    sequence.arrival_ns = sequence.queued_ns = now_ns
    return sequence


def run_plan(scheduler: Scheduler, plan: StepPlan) -> list[Sequence]:
    """Apply a plan as the worker would; returns the sequences that finished."""
    finished = []
    for sequence, count in plan.chunks:
        sequence.num_cached += count
        if sequence.num_cached == sequence.num_tokens:
            sequence.prefilled = True
            sequence.output_ids.append(0)
    for sequence in plan.decodes:
        sequence.num_cached = sequence.num_tokens
        sequence.output_ids.append(0)
    for sequence in [s for s, _ in plan.chunks] + plan.decodes:
        if sequence.prefilled and len(sequence.output_ids) >= sequence.params.max_tokens:
            scheduler.finish(sequence)
            finished.append(sequence)
    return finished
