"""The hooks a step fires about its batch rather than about one token: who was admitted
(`on_schedule`, `on_prefix_hit`), whose prefill starts and ends (`on_prefill_start`,
`on_prefill_end`) and what the whole step did (`on_step`'s `StepStats`), and the same counts
summed into the engine's totals; and a request's last events (`on_blame`, `on_finish`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.hooks import StepStats

if TYPE_CHECKING:
    from engine.blame import RequestBlame
    from engine.kv_cache import PagedKVCache
    from engine.outputs import EngineTotals
    from engine.scheduler import Scheduler, StepPlan
    from engine.sequence import Sequence


def announce_admitted(
    by_event: dict[str, list[Callable[..., None]]], admitted: list[Sequence], now: int
) -> None:
    """`on_schedule` for every sequence given a batch slot at `now` (the plan instant),
    `on_prefix_hit` for those whose prompt was partly found in the prefix cache."""
    for hook in by_event["on_schedule"]:
        for sequence in admitted:
            hook(sequence.request_id, now)
    for hook in by_event["on_prefix_hit"]:
        for sequence in admitted:
            if sequence.prefix_hit_tokens:
                hook(sequence.request_id, now, sequence.prefix_hit_tokens)


def announce_finish(
    by_event: dict[str, list[Callable[..., None]]],
    request_id: str,
    now: int,
    reason: str,
    blame: RequestBlame | None,
) -> None:
    """A request's last events: `on_blame` with who made it wait (blame on), `on_finish`."""
    if blame is not None:
        for hook in by_event["on_blame"]:
            hook(request_id, now, blame)
    for hook in by_event["on_finish"]:
        hook(request_id, now, reason)


def announce_prefill_start(
    by_event: dict[str, list[Callable[..., None]]], sequences: list[Sequence]
) -> None:
    """`on_prefill_start` for every sequence whose first chunk since its (re)admission runs
    now, with the tokens it has left to prefill."""
    now = time.perf_counter_ns()
    for hook in by_event["on_prefill_start"]:
        for sequence in sequences:
            if not sequence.prefill_started:
                hook(sequence.request_id, now, sequence.num_tokens - sequence.num_cached)


def announce_prefill_end(
    by_event: dict[str, list[Callable[..., None]]], completed: list[Sequence]
) -> None:
    """`on_prefill_end` for every sequence whose whole prompt is now in the cache."""
    now = time.perf_counter_ns()
    for hook in by_event["on_prefill_end"]:
        for sequence in completed:
            hook(sequence.request_id, now)


def step_stats(
    step: int,
    started_ns: int,
    finished_ns: int,
    plan: StepPlan,
    decoding: list[Sequence],
    scheduler: Scheduler,
    cache: PagedKVCache,
    *,
    decode_tokens: int,
    prefix_tokens: tuple[int, int],
    speculative_tokens: tuple[int, int],
    shed: list[tuple[int, str]],
) -> StepStats:
    """What step number `step` did, after it ran. `prefix_tokens`: (queried, hit) in the
    prefix cache; `speculative_tokens`: (drafted, accepted); `shed`: (priority, reason)."""
    preempted: dict[int, int] = {}
    for sequence in plan.preempted:
        preempted[sequence.priority] = preempted.get(sequence.priority, 0) + 1
    return StepStats(
        step=step,
        time_ns=finished_ns,
        step_time_s=(finished_ns - started_ns) / 1e9,
        batch_size=len(plan.chunks) + len(decoding),
        prefill_tokens=plan.prefill_tokens,
        decode_tokens=decode_tokens,
        num_waiting=scheduler.num_waiting,
        num_running=len(scheduler.running),
        num_preempted=len(plan.preempted),
        kv_blocks_total=cache.num_blocks,
        kv_blocks_free=cache.allocator.num_free,
        waiting_by_priority=scheduler.waiting_by_priority(),
        prefix_cache_queried_tokens=prefix_tokens[0],
        prefix_cache_hit_tokens=prefix_tokens[1],
        spec_draft_tokens=speculative_tokens[0],
        spec_accepted_tokens=speculative_tokens[1],
        prefill_chunks=len(plan.chunks),
        preempted_by_priority=preempted,
        queue_waits=tuple(
            (s.priority, max(0, started_ns - s.queued_ns) / 1e9) for s in plan.admitted
        ),
        shed=tuple(shed),
    )


def prefix_lookups(admitted: list[Sequence]) -> tuple[int, int]:
    """Tokens looked up in the prefix cache by the sequences admitted, and those found."""
    return sum(s.num_tokens for s in admitted), sum(s.prefix_hit_tokens for s in admitted)


def add_to_totals(
    totals: EngineTotals,
    plan: StepPlan,
    decode_tokens: int,
    prefix_tokens: tuple[int, int],
    speculative_tokens: tuple[int, int],
) -> None:
    """Sum what one step computed into the engine's totals (the same counts as `step_stats`)."""
    totals.prefill_tokens += plan.prefill_tokens
    totals.decode_tokens += decode_tokens
    totals.prefix_cache_queried_tokens += prefix_tokens[0]
    totals.prefix_cache_hit_tokens += prefix_tokens[1]
    totals.spec_draft_tokens += speculative_tokens[0]
    totals.spec_accepted_tokens += speculative_tokens[1]
