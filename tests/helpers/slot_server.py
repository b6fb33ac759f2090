"""A stand-in OpenAI-compatible server whose capacity is known exactly: K slots, each request
holds one for a fixed T seconds, the rest wait in arrival order. It serves K / T requests/s.

Slots are kept on a virtual schedule: a slot frees at exactly start + T and its next request
starts at max(its arrival, that instant), whenever the event loop wakes up to hand it over:
a late wake-up of a busy machine delays a reply, never the slots, so the capacity is K / T.
A waiting request whose client leaves is dropped, as engines abort it. The first token is
sent when the slot is taken (TTFT = the wait), the second and the end when it is released
(e2e = wait + T).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import subprocess
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class SlotServer:
    def __init__(self, slots: int, hold_s: float, model: str = "slots") -> None:
        self.slots, self.hold_s, self.model = slots, hold_s, model
        self._free_at = [0.0] * slots  # a heap: when each slot comes free (perf_counter)
        self._waiting: deque[tuple[float, asyncio.Future[tuple[float, float]]]] = deque()
        self._wake: asyncio.Event | None = None
        self.served = 0

    @property
    def capacity_rps(self) -> float:
        return self.slots / self.hold_s

    async def _dispatch(self) -> None:
        """Give the next slot to come free to the longest-waiting request still connected
        (an engine aborts a request whose client left: a step the search cut short leaves
        no backlog behind), from the instant it frees."""
        assert self._wake is not None
        while True:
            while not self._waiting:
                self._wake.clear()
                await self._wake.wait()
            await _sleep_until(self._free_at[0])
            while self._waiting and self._waiting[0][1].cancelled():
                self._waiting.popleft()
            if not self._waiting:
                continue
            arrival, reply = self._waiting.popleft()
            start = max(arrival, heapq.heappop(self._free_at))
            heapq.heappush(self._free_at, start + self.hold_s)
            reply.set_result((start, start + self.hold_s))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await receive()  # startup
            self._wake = asyncio.Event()
            dispatcher = asyncio.create_task(self._dispatch())
            await send({"type": "lifespan.startup.complete"})
            await receive()  # shutdown
            dispatcher.cancel()
            await send({"type": "lifespan.shutdown.complete"})
            return
        path = scope["path"]
        if path == "/health":
            await _json(send, {"status": "ok"})
        elif path == "/v1/models":
            await _json(send, {"data": [{"id": self.model, "max_model_len": 4096}]})
        else:
            await self._complete(receive, send)

    async def _complete(self, receive: Receive, send: Send) -> None:
        while (await receive()).get("more_body"):
            pass
        assert self._wake is not None
        reply: asyncio.Future[tuple[float, float]] = asyncio.get_running_loop().create_future()
        self._waiting.append((time.perf_counter(), reply))
        self._wake.set()
        watch = asyncio.create_task(receive())  # http.disconnect when the client leaves
        done, _ = await asyncio.wait({reply, watch}, return_when=asyncio.FIRST_COMPLETED)
        if reply not in done:
            reply.cancel()
            return
        watch.cancel()
        _, end = reply.result()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": _chunk("a"), "more_body": True})
        await _sleep_until(end)
        usage = {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
        tail = _chunk("b") + _chunk(None, usage) + b"data: [DONE]\n\n"
        await send({"type": "http.response.body", "body": tail})
        self.served += 1


async def _sleep_until(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


def _chunk(text: str | None, usage: dict[str, int] | None = None) -> bytes:
    choices = [] if text is None else [{"index": 0, "delta": {"content": text}}]
    body: dict[str, Any] = {"object": "chat.completion.chunk", "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def _json(send: Send, body: dict[str, Any]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


def main() -> None:
    """`python -m tests.helpers.slot_server K T PORT`: serve on 127.0.0.1 in its own process,
    so the load generator and the stand-in never share one interpreter lock."""
    import uvicorn

    slots, hold_s, port = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    uvicorn.run(SlotServer(slots, hold_s), host="127.0.0.1", port=port, log_level="warning")


@contextlib.contextmanager
def slot_server_process(slots: int, hold_s: float) -> Iterator[str]:
    """The stand-in in a child process on a free loopback port; yields its base URL."""
    from slo.cli.bench.server import free_port, stop_process
    from tests.helpers.polling import wait_until_ready

    port = free_port()
    command = [
        sys.executable,
        "-m",
        "tests.helpers.slot_server",
        str(slots),
        str(hold_s),
        str(port),
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base_url + "/health", process=process)
        yield base_url
    finally:
        stop_process(process)


if __name__ == "__main__":
    main()
