"""The regression demo's server: the bundled engine, in this process, behind a switch.

In-process rather than a `slo serve` child because the regression is injected into the
engine itself: the worker's `step_faults` hook (the engine's seam for fault tests) runs
before every forward pass, and `SlowPrefill` sleeps there when a forward carries a request's
first chunk, i.e. its prefill. The switch lets the demo calibrate on the bare engine first
and then put the latency middleware, built with the calibrated spec, in front of it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from middleware.types import ASGIApp, Receive, Scope, Send

MODEL = "bundled:tiny"


@dataclass
class SlowPrefill:
    """Sleeps `delay_s` before every forward pass that starts a request's prefill, once
    `delay_s` is set: a regression in the prefill kernel, seen from outside the engine."""

    delay_s: float = 0.0
    seen: set[str] = field(default_factory=set)

    def __call__(self, request_ids: list[str]) -> None:
        new = [request_id for request_id in request_ids if request_id not in self.seen]
        self.seen.update(new)
        if new and self.delay_s > 0:
            time.sleep(self.delay_s)


class Switch:
    """An ASGI app that forwards to whichever app it holds now."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


@dataclass
class DemoServer:
    base_url: str
    engine: Any
    switch: Switch
    slow: SlowPrefill
    bare: ASGIApp  # the engine's OpenAI app, without a middleware
    hooks: Any = None  # the engine hooks of the middleware in front now


@contextmanager
def demo_server() -> Iterator[DemoServer]:
    """The bundled engine warmed up and served by uvicorn on a free loopback port."""
    import uvicorn

    from engine import Engine, EngineConfig
    from engine.api.app import create_app
    from slo.cli.bench.server import free_port

    engine = Engine.from_pretrained(MODEL, EngineConfig())
    engine.start_sync()
    slow = SlowPrefill()
    engine.worker.step_faults = slow
    bare = create_app(engine)
    switch = Switch(bare)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(switch, host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, name="slo-demo-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the demo server on 127.0.0.1:{port} did not start")
        time.sleep(0.05)
    try:
        yield DemoServer(f"http://127.0.0.1:{port}", engine, switch, slow, bare)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        engine.stop_sync()
