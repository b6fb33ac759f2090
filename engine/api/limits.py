"""Time limits of a request: a first-token deadline (queue wait + prefill) and an overall one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from engine.outputs import RequestOutput
from engine.stream import RequestStream


@dataclass(frozen=True)
class Limits:
    """Time limits of one request, in seconds (None: no limit)."""

    first_token_timeout_s: float | None = (
        None  # queue wait + prefill: a request that cannot start in time is given up
    )
    request_timeout_s: float | None = None  # the whole request


class Deadline:
    def __init__(self, started: float, limits: Limits) -> None:
        self.started = started
        self.limits = limits

    def _remaining(self, limit: float | None) -> float | None:
        return None if limit is None else max(limit - (time.monotonic() - self.started), 0.0)

    async def first_output(self, stream: RequestStream) -> RequestOutput:
        limits = self.limits
        waits = [
            w
            for w in (
                self._remaining(limits.first_token_timeout_s),
                self._remaining(limits.request_timeout_s),
            )
            if w is not None
        ]
        try:
            async with asyncio.timeout(min(waits) if waits else None):
                return await anext(stream)
        except TimeoutError:
            raise TimeoutError(
                f"no token within the server's limit ({self._describe()}); "
                "retry later or with a shorter prompt"
            ) from None

    async def outputs(
        self, stream: RequestStream, first: RequestOutput
    ) -> AsyncIterator[RequestOutput]:
        yield first
        if first.finished:
            return
        while True:
            try:
                async with asyncio.timeout(self._remaining(self.limits.request_timeout_s)):
                    output = await anext(stream)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise TimeoutError(
                    "the request ran past the server's limit of "
                    f"{self.limits.request_timeout_s:g} s; ask for fewer tokens"
                ) from None
            yield output
            if output.finished:
                return

    def _describe(self) -> str:
        parts = []
        if self.limits.first_token_timeout_s is not None:
            parts.append(f"first token within {self.limits.first_token_timeout_s:g} s")
        if self.limits.request_timeout_s is not None:
            parts.append(f"whole request within {self.limits.request_timeout_s:g} s")
        return ", ".join(parts)
