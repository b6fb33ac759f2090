"""The engine's instrumentation hooks: the protocol, the step record, and their dispatch table.

Every event carries the request id and a `time.perf_counter_ns()` stamp taken where the event
happened. `on_enqueue` runs on the thread that called `Engine.generate` (so a hook can read the
caller's context variables and tie the request id to its own per-request state); every other
event runs on the engine's worker thread, so hooks must be quick and must not block.

`on_prefix_hit` and `on_blame` are newer than the rest and optional like every event;
`StepStats` gains fields with defaults, so hooks written for older engines keep working.

With chunked prefill a prompt may span several steps: `on_prefill_start` fires with its first
chunk (num_tokens: every token its prefill will compute) and `on_prefill_end` after its last;
each chunk shows in its step's `StepStats` (`prefill_chunks`, `prefill_tokens`). A request shed
by the scheduler ends with `on_finish(..., reason="shed")`.

Hooks are structurally typed: any object with some of these methods works, missing methods are
skipped (they are looked up once, when the hooks are added), and with no hooks registered the
engine pays nothing per event.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

HOOK_EVENTS = (
    "on_enqueue",
    "on_schedule",
    "on_prefill_start",
    "on_prefill_end",
    "on_token",
    "on_detokenize",
    "on_finish",
    "on_step",
    "on_prefix_hit",
    "on_blame",
)


@dataclass(frozen=True, slots=True)
class StepStats:
    """What one scheduler step did; handed to `on_step` after the step."""

    step: int
    time_ns: int
    step_time_s: float
    batch_size: int
    prefill_tokens: int
    decode_tokens: int
    num_waiting: int
    num_running: int
    num_preempted: int
    kv_blocks_total: int
    kv_blocks_free: int
    waiting_by_priority: dict[int, int] = field(default_factory=dict)
    # Prefix caching (0 when off): prompt tokens looked up in the cache at admission this
    # step, and how many of them were found (their prefill was skipped).
    prefix_cache_queried_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    # Speculative decoding (0 when off): draft tokens proposed this step, and how many of
    # them the target accepted (the acceptance rate is accepted / draft over a window).
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    # Tier isolation. Prefill chunks this step (a long prompt spans several steps: each of its
    # chunks counts in its step; `prefill_tokens` counts the chunks' tokens).
    prefill_chunks: int = 0
    # Sequences preempted this step, by priority.
    preempted_by_priority: dict[int, int] = field(default_factory=dict)
    # (priority, seconds waited) of each request given a batch slot this step, counted from
    # when it joined the queue (its arrival, or its preemption).
    queue_waits: tuple[tuple[int, float], ...] = ()
    # (priority, reason) of each request shed since the previous step: "ttft_out_of_reach"
    # (the slo policy) or "queue_full" (the waiting queue's bound, at submit).
    shed: tuple[tuple[int, str], ...] = ()

    @property
    def kv_usage(self) -> float:
        """Fraction of KV-cache blocks in use, 0..1."""
        if self.kv_blocks_total == 0:
            return 0.0
        return 1.0 - self.kv_blocks_free / self.kv_blocks_total


@runtime_checkable
class EngineHooks(Protocol):
    """Implement any subset of these methods and pass the object to `Engine.add_hooks`."""

    def on_enqueue(
        self, request_id: str, time_ns: int, prompt_tokens: int, priority: int
    ) -> None: ...

    def on_schedule(self, request_id: str, time_ns: int) -> None: ...

    def on_prefill_start(self, request_id: str, time_ns: int, num_tokens: int) -> None: ...

    def on_prefill_end(self, request_id: str, time_ns: int) -> None: ...

    def on_token(self, request_id: str, time_ns: int, token_index: int) -> None: ...

    def on_detokenize(self, request_id: str, time_ns: int, duration_ns: int) -> None: ...

    def on_finish(self, request_id: str, time_ns: int, reason: str) -> None: ...

    def on_step(self, stats: StepStats) -> None: ...

    def on_prefix_hit(self, request_id: str, time_ns: int, cached_tokens: int) -> None:
        """Optional. With prefix caching on, when a request is admitted and `cached_tokens` of
        its prompt were found in the cache (only when > 0; it then precedes on_prefill_start,
        whose num_tokens counts only the tokens actually computed). A preempted request that
        is admitted again can fire it again."""

    def on_blame(self, request_id: str, time_ns: int, blame: Any) -> None:
        """Optional. Who made the request wait (`engine.blame.RequestBlame`: its queue wait,
        decode interference and preemptions, by the culprits' priority, and its top
        culprits), right before its `on_finish`, with the same time; not fired with
        `EngineConfig.blame` off (docs/blame.md)."""


class HookDispatch:
    """Bound hook methods per event, looked up once when hooks are added (the worker reads
    `by_event` per event, so an event nobody listens to costs one empty loop)."""

    def __init__(self) -> None:
        self.hooks: list[Any] = []
        self.by_event: dict[str, list[Callable[..., None]]] = {event: [] for event in HOOK_EVENTS}

    def add(self, hooks: Any) -> None:
        self.hooks.append(hooks)
        self._rebuild()

    def remove(self, hooks: Any) -> None:
        self.hooks.remove(hooks)
        self._rebuild()

    def _rebuild(self) -> None:
        # A new dict, swapped in whole: a step reading the old one sees a consistent table.
        self.by_event = {
            event: [getattr(h, event) for h in self.hooks if callable(getattr(h, event, None))]
            for event in HOOK_EVENTS
        }
