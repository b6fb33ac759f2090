"""The hooks a step fires about itself rather than about one token: who was admitted
(`on_schedule`, `on_prefix_hit`) and what the whole step did (`on_step`'s `StepStats`)."""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.hooks import StepStats
from engine.kv_cache import PagedKVCache
from engine.scheduler import Scheduler, Sequence, StepPlan


def announce_admitted(
    by_event: dict[str, list[Callable[..., None]]], admitted: list[Sequence]
) -> None:
    """`on_schedule` for every sequence given a batch slot, `on_prefix_hit` for those whose
    prompt was partly found in the prefix cache."""
    now = time.perf_counter_ns()
    for hook in by_event["on_schedule"]:
        for sequence in admitted:
            hook(sequence.request_id, now)
    for hook in by_event["on_prefix_hit"]:
        for sequence in admitted:
            if sequence.prefix_hit_tokens:
                hook(sequence.request_id, now, sequence.prefix_hit_tokens)


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
