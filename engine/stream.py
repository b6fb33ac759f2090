"""The caller's end of one request: an async iterator over what the worker thread delivers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from engine.outputs import RequestOutput


class RequestStream:
    """The caller's end of one request: an async iterator of `RequestOutput` pieces.

    Closing it (or abandoning the `generate` iterator) before the request finished cancels the
    request through `abort` (called with the request id, from any thread); the engine frees
    its KV blocks within one step.
    """

    def __init__(self, request_id: str, prompt_tokens: int, abort: Callable[[str], None]) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self._abort = abort
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self.finished = False

    def deliver(self, item: RequestOutput | BaseException) -> None:
        """Called on the worker thread. A caller whose event loop is gone cannot read any more."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening
            self.finished = True
            self._abort(self.request_id)

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
            self._abort(self.request_id)
