"""A scripted engine behind the real middleware, for the live SLO-headroom test: K slots,
each request holding one for a fixed prefill then decode, the rest waiting by tier priority
(premium first, arrival order within a tier). It calls the engine-bridge hooks as the bundled
engine does (enqueue, schedule, prefill, tokens, finish, and a step's waiting per priority),
so `/metrics` carries queue depth, prefill time and finished requests as it would on the
bundled engine, and the SLO-headroom gauge is computed from them.

`python -m tests.helpers.hooked_slot_engine SPEC K PREFILL_S DECODE_S PORT` serves it with
uvicorn on 127.0.0.1 in its own process (the load generator never shares its interpreter).
Its capacity is K / (PREFILL_S + DECODE_S) requests/s.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from middleware.config import MiddlewareConfig
from middleware.types import Receive, Scope, Send
from tests.helpers.slot_server import _chunk, _json  # the same SSE chunks and JSON replies


@dataclass
class Step:
    """What `middleware.metrics.engine_series.EngineSeries.observe_step` reads of a step."""

    num_running: int
    waiting_by_priority: dict[int, int]
    batch_size: int = 0
    kv_usage: float = 0.0
    shed: tuple[Any, ...] = field(default_factory=tuple)


class HookedSlotEngine:
    def __init__(self, slots: int, prefill_s: float, decode_s: float, priorities: dict[str, int]):
        self.slots, self.prefill_s, self.decode_s = slots, prefill_s, decode_s
        self.priorities = priorities  # tier name -> priority (lower is served first)
        self.default_priority = max(priorities.values(), default=0)
        self.hooks: Any = None  # the middleware's EngineBridge, set once both exist
        self.running = 0
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []  # a heap
        self._order = itertools.count()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await receive()
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/health":
            await _json(send, {"status": "ok"})
        elif scope["path"] == "/v1/models":
            await _json(send, {"data": [{"id": "slots", "max_model_len": 4096}]})
        else:
            while (await receive()).get("more_body"):
                pass
            await self._generate(scope, send)

    def _publish(self) -> None:
        waiting: dict[int, int] = {}
        for priority, _, _ in self._waiting:
            waiting[priority] = waiting.get(priority, 0) + 1
        self.hooks.on_step(Step(self.running, waiting, batch_size=self.running))

    def _admit(self) -> None:
        while self.running < self.slots and self._waiting:
            _, _, ready = heapq.heappop(self._waiting)
            self.running += 1
            ready.set_result(None)
        self._publish()

    async def _generate(self, scope: Scope, send: Send) -> None:
        request_id = scope["state"]["request_id"]
        headers = dict(scope["headers"])
        tier = headers.get(b"x-llm-tier", b"").decode()
        priority = self.priorities.get(tier, self.default_priority)
        hooks = self.hooks
        hooks.on_enqueue(request_id, time.perf_counter_ns(), 4, priority)
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._order), ready))
        self._admit()
        await ready
        try:
            hooks.on_schedule(request_id, time.perf_counter_ns())
            hooks.on_prefill_start(request_id, time.perf_counter_ns(), 4)
            await asyncio.sleep(self.prefill_s)
            hooks.on_prefill_end(request_id, time.perf_counter_ns())
            await self._stream(request_id, send)
        finally:
            self.running -= 1
            self._admit()

    async def _stream(self, request_id: str, send: Send) -> None:
        start = {"type": "http.response.start", "status": 200,
                 "headers": [(b"content-type", b"text/event-stream")]}  # fmt: skip
        await send(start)
        self.hooks.on_token(request_id, time.perf_counter_ns(), 0)
        await send({"type": "http.response.body", "body": _chunk("a"), "more_body": True})
        await asyncio.sleep(self.decode_s)
        self.hooks.on_token(request_id, time.perf_counter_ns(), 1)
        self.hooks.on_finish(request_id, time.perf_counter_ns(), "length")
        usage = {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
        tail = _chunk("b") + _chunk(None, usage) + b"data: [DONE]\n\n"
        await send({"type": "http.response.body", "body": tail})


def build(spec_path: str, slots: int, prefill_s: float, decode_s: float) -> Any:
    """The real LatencyMiddleware over the engine, its hooks wired (no record store)."""
    from prometheus_client import CollectorRegistry

    from middleware import LatencyMiddleware
    from slo.spec import SLOSpec

    spec = SLOSpec.load(spec_path)
    engine = HookedSlotEngine(slots, prefill_s, decode_s, {t.name: t.priority for t in spec.tiers})
    app = LatencyMiddleware(
        engine,
        spec=spec,
        store=None,
        model="slots",
        config=MiddlewareConfig.of(registry=CollectorRegistry()),
    )
    engine.hooks = app.engine_hooks()
    return app


def main() -> None:
    import uvicorn

    spec_path, slots, prefill_s, decode_s, port = sys.argv[1:6]
    app = build(spec_path, int(slots), float(prefill_s), float(decode_s))
    uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning")


@contextlib.contextmanager
def hooked_engine_process(
    spec_path: Path, slots: int, prefill_s: float, decode_s: float
) -> Iterator[str]:
    """The engine and its middleware in a child process on a free loopback port."""
    from slo.cli.bench.server import free_port, stop_process
    from tests.helpers.polling import wait_until_ready

    port = free_port()
    command = [sys.executable, "-m", "tests.helpers.hooked_slot_engine", str(spec_path),
               str(slots), str(prefill_s), str(decode_s), str(port)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base_url + "/health", process=process)
        yield base_url
    finally:
        stop_process(process)


if __name__ == "__main__":
    main()
