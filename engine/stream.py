"""The caller's side of requests and the engine's small records: streams, cold start, totals,
and the table of hook methods."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.hooks import HOOK_EVENTS
from engine.outputs import RequestOutput

if TYPE_CHECKING:
    from engine.engine import Engine


@dataclass
class EngineTotals:
    """Counters since the engine was made (tokens): what `on_step` reports, summed."""

    prefill_tokens: int = 0  # tokens computed by prefills (prefix-cache hits excluded)
    decode_tokens: int = 0
    prefix_cache_queried_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0


@dataclass(frozen=True)
class ColdStart:
    """How long the engine took to become ready: reading weights, then the warm-up forward."""

    load_s: float
    warmup_s: float

    @property
    def total_s(self) -> float:
        return self.load_s + self.warmup_s


class RequestStream:
    """The caller's end of one request: an async iterator of `RequestOutput` pieces.

    Closing it (or abandoning the `generate` iterator) before the request finished cancels the
    request; the engine frees its KV blocks within one step.
    """

    def __init__(self, engine: Engine, request_id: str, prompt_tokens: int) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self._engine = engine
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self.finished = False

    def _deliver(self, item: RequestOutput | BaseException) -> None:
        """Called on the worker thread. A caller whose event loop is gone cannot read any more."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening
            self.finished = True
            self._engine.abort(self.request_id)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finish_reason is not None:
            self.finished = True
        return item

    def cancel(self) -> None:
        if not self.finished:
            self.finished = True
            self._engine.abort(self.request_id)


class HookDispatch:
    """Bound hook methods per event, looked up once when hooks are added."""

    def __init__(self) -> None:
        self.hooks: list[Any] = []
        self.by_event: dict[str, list[Callable[..., None]]] = {event: [] for event in HOOK_EVENTS}

    def rebuild(self) -> None:
        self.by_event = {
            event: [getattr(h, event) for h in self.hooks if callable(getattr(h, event, None))]
            for event in HOOK_EVENTS
        }
