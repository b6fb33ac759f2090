"""Instructions per streamed piece on `slo proxy`'s direct write (docs/proxy.md).

A vLLM-shaped chunk is offered 1,000 times to the measured direct write over the server's
offer (`slo.cli.proxy.direct`), counted by valgrind's callgrind, two ways: the one-call offers
both layers give (`hotpath.measured_offer` over the server's `offer`), and the generic path a
`DirectBody` without them takes (each layer's `ready`, then each layer's `write`):

    python -m tests.benchmarks.direct_piece_instructions

A diagnostic, not a benchmark with a goal: it prints instructions per piece for each.
"""

from __future__ import annotations

import asyncio
import operator
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PIECE = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}'
    b"\n\n"
)
PIECES = 1000


def _generic(direct_body: Any) -> Any:
    """A `DirectBody` that drops any one-call `offer` it is given."""

    class Generic(direct_body):  # type: ignore[misc, valid-type]  # a class made at run time
        __slots__ = ()

        def __init__(self, send: Any, ready: Any, write: Any, offer: Any = None) -> None:
            super().__init__(send, ready, write)

    return Generic


async def _offer_pieces(generic: bool) -> None:
    import middleware.request.exchange_direct as exchange_direct
    import slo.cli.proxy.direct as proxy_direct
    from middleware.clock import SystemClock
    from middleware.request.exchange import Exchange
    from middleware.request.timeline import RequestTimeline
    from tests.helpers.cycle_standin import cycle_standin

    if generic:
        layers: tuple[Any, ...] = (proxy_direct, exchange_direct)
        for module in layers:
            module.DirectBody = _generic(module.DirectBody)

    async def below(message: Any) -> None:
        pass

    written: list[bytes] = []
    cycle = cycle_standin(written.append, below)
    timeline = RequestTimeline.begin("r", SystemClock())
    no_receive: Any = None  # the request is not read here
    exchange = Exchange(timeline, no_receive, below, time.perf_counter_ns, replay=[])
    headers = [(b"content-type", b"text/event-stream")]
    await exchange.send({"type": "http.response.start", "status": 200, "headers": headers})
    offer = exchange_direct.measured_direct_body(exchange, proxy_direct._offer(cycle)).offer
    for _ in range(200):  # warm
        offer(PIECE)

    def pieces() -> None:
        for _ in range(PIECES):
            offer(PIECE)

    operator.call(pieces)  # callgrind counts inside this call only


def _count(generic: bool) -> float:
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "callgrind.out"
        command = [
            "valgrind",
            "--tool=callgrind",
            "--collect-atstart=no",
            "--toggle-collect=_operator_call*",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "tests.benchmarks.direct_piece_instructions",
            "--run",
            "generic" if generic else "one-call",
        ]
        subprocess.run(command, check=True, capture_output=True)
        total = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
        assert total is not None, "callgrind wrote no totals"
        return int(total.group(1)) / PIECES


def main() -> None:
    if sys.argv[1:2] == ["--run"]:
        asyncio.run(_offer_pieces(sys.argv[2] == "generic"))
        return
    for generic in (False, True):
        name = "generic ready + write" if generic else "one-call offers"
        print(f"{name}: {_count(generic) / 1e3:.1f}k instructions per piece")


if __name__ == "__main__":
    main()
