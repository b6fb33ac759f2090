"""What `slo proxy`'s server offer (`slo.cli.proxy.direct._offer`) reads of uvicorn's request
cycle, as a plain object: its response state, its flow control and its transport's write."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any


def cycle_standin(
    write: Callable[[bytes], None],
    send: Any,
    *,
    chunked: bool | None = True,
    started: bool = True,
    complete: bool = False,
    paused: bool = False,
    gone: bool = False,
) -> Any:
    return SimpleNamespace(
        flow=SimpleNamespace(write_paused=paused),
        transport=SimpleNamespace(write=write),
        chunked_encoding=chunked,
        response_started=started,
        response_complete=complete,
        disconnected=gone,
        send=send,
    )
