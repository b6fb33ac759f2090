"""The instrumentation hook protocol of the engine.

Every event carries the request id and a `time.perf_counter_ns()` stamp taken where the event
happened. `on_enqueue` runs on the thread that called `Engine.generate` (so a hook can read the
caller's context variables and tie the request id to its own per-request state); every other
event runs on the engine's worker thread, so hooks must be quick and must not block.

Hooks are structurally typed: any object with some of these methods works, missing methods are
skipped (they are looked up once, when the hooks are added), and with no hooks registered the
engine pays nothing per event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

HOOK_EVENTS = (
    "on_enqueue",
    "on_schedule",
    "on_prefill_start",
    "on_prefill_end",
    "on_token",
    "on_detokenize",
    "on_finish",
    "on_step",
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
