"""The engine bridge: hook methods that fill each request's timeline from the engine's events.

Register it on the bundled engine with `engine.add_hooks(middleware.engine_hooks())`. Any
engine that calls the same methods works (the protocol is structural). Requests are found by
the id the middleware hands the app in `scope["state"]["request_id"]`, or, for engines that
pick their own ids, through the request's context when `on_enqueue` runs on the caller's thread.
The engine's blame for a request (`on_blame`, right before `on_finish`) goes on its timeline,
as its record keeps it, and to the `on_blame` callback (the delay counters).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from middleware.request.blame import blame_record
from middleware.request.context import current_timeline
from middleware.request.timeline import RequestTimeline


class EngineBridge:
    def __init__(
        self,
        on_step: Callable[[Any], None] | None = None,
        on_blame: Callable[[Any], None] | None = None,
        tier_names: Mapping[int, str] | None = None,
    ) -> None:
        """`tier_names`: the spec's tier names by priority, to name the blame's culprits."""
        self._timelines: dict[str, RequestTimeline] = {}
        self._lock = threading.Lock()
        self._on_step = on_step
        self._on_blame = on_blame
        self._tier_names = dict(tier_names or {})

    # Once each per request: a single dict store or pop is atomic, no lock needed.
    def register(self, timeline: RequestTimeline) -> None:
        self._timelines[timeline.request_id] = timeline

    def unregister(self, timeline: RequestTimeline) -> None:
        self._timelines.pop(timeline.request_id, None)

    def __len__(self) -> int:
        return len(self._timelines)

    # ----------------------------------------------------------------- the hook protocol
    def on_enqueue(self, request_id: str, time_ns: int, prompt_tokens: int, priority: int) -> None:
        timeline = self._timelines.get(request_id)
        if timeline is None:
            timeline = current_timeline()
            if timeline is None:
                return  # a request that does not pass through this middleware
            with self._lock:
                self._timelines[request_id] = timeline
        timeline.mark("enqueue", time_ns, tokens=prompt_tokens)

    def on_schedule(self, request_id: str, time_ns: int) -> None:
        timeline = self._timelines.get(request_id)
        if timeline is not None:
            timeline.mark("schedule", time_ns)

    def on_prefill_start(self, request_id: str, time_ns: int, num_tokens: int) -> None:
        timeline = self._timelines.get(request_id)
        if timeline is not None:
            timeline.mark("prefill_start", time_ns)

    def on_prefix_hit(self, request_id: str, time_ns: int, cached_tokens: int) -> None:
        timeline = self._timelines.get(request_id)
        if timeline is not None:
            timeline.prefix_cached(cached_tokens)

    def on_prefill_end(self, request_id: str, time_ns: int) -> None:
        timeline = self._timelines.get(request_id)
        if timeline is not None:
            timeline.mark("prefill_end", time_ns)

    def on_token(self, request_id: str, time_ns: int, token_index: int) -> None:
        timeline = self._timelines.get(request_id)
        if timeline is not None:
            timeline.mark("token", time_ns)

    def on_detokenize(self, request_id: str, time_ns: int, duration_ns: int) -> None:
        timeline = self._timelines.get(request_id)
        if timeline is not None:
            timeline.mark("detokenize", time_ns, duration_ns=duration_ns)

    def on_finish(self, request_id: str, time_ns: int, reason: str) -> None:
        timeline = self._timelines.get(request_id)
        if timeline is not None:
            timeline.mark("finish", time_ns, reason=reason)

    def on_blame(self, request_id: str, time_ns: int, blame: Any) -> None:
        timeline = self._timelines.get(request_id)
        if timeline is not None:
            timeline.delay_blame = blame_record(blame, self._tier_names)
        if self._on_blame is not None:
            self._on_blame(blame)

    def on_step(self, stats: Any) -> None:
        if self._on_step is not None:
            self._on_step(stats)
