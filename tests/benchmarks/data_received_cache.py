"""How much cold CPU caches cost the proxy's Python per wake-up (docs/proxy.md, "cold caches").

uvicorn's `data_received` (the protocol `slo proxy` serves on) is fed one chat request at a
time, each answered by a trivial app, and timed with warm caches and with `--thrash-mb` MB
touched between requests, as the client and the upstream do when they run between two of the
proxy's wake-ups:

    python -m tests.benchmarks.data_received_cache
    python -m tests.benchmarks.data_received_cache --thrash-mb 64

A diagnostic, not a benchmark with a goal: it prints the median time per call.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import numpy as np
import uvloop
from uvicorn.config import Config
from uvicorn.server import ServerState

from slo.cli.proxy.direct import DirectBodyProtocol

BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true}'
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
    b"content-type: application/json\r\nx-llm-tier: premium\r\ncontent-length: %d\r\n\r\n"
    % len(BODY)
) + BODY


class _Transport(asyncio.Transport):
    """A client connection that takes every write and never pushes back."""

    def __init__(self) -> None:
        super().__init__()
        self._closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )

    def write(self, data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def median_data_received_us(requests: int, thrash_mb: int) -> float:
    config = Config(_app, http=DirectBodyProtocol, log_level="warning", lifespan="off")
    config.load()
    protocol = DirectBodyProtocol(
        config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop()
    )
    protocol.connection_made(_Transport())
    junk = np.ones(thrash_mb * 1024 * 1024 // 8) if thrash_mb else None
    times = []
    for _ in range(requests):
        if junk is not None:
            junk += 1.0  # evicts the caches, as other processes between wake-ups do
        started = time.perf_counter_ns()
        protocol.data_received(REQUEST)
        times.append(time.perf_counter_ns() - started)
        for _ in range(3):  # the app's task runs and the response completes
            await asyncio.sleep(0)
    return statistics.median(times[requests // 5 :]) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=800)
    parser.add_argument("--thrash-mb", type=int, default=0)
    args = parser.parse_args()
    median = uvloop.run(median_data_received_us(args.requests, args.thrash_mb))
    print(f"data_received p50: {median:.1f} us ({args.thrash_mb} MB touched between calls)")


if __name__ == "__main__":
    main()
