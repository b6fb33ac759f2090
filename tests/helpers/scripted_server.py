"""An independent OpenAI-compatible server (a few lines of Starlette streaming, no llm-slo
inside) whose delays are scripted, for `slo bench`'s client-side timings to be held against;
`serve_scripted` runs it in a process of its own."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

SCRIPTED_TTFT_S = 0.120
SCRIPTED_GAPS_S = (0.040, 0.080, 0.020, 0.060)


def scripted_app(sent_at: dict[str, list[float]]) -> Starlette:
    """Stream five text chunks: the first after SCRIPTED_TTFT_S, then after each gap.

    `sent_at[request]` gets the perf_counter of the request's arrival and of each text chunk
    (served at /stamps): how long the server really waited, sleep overshoot on a busy machine
    included. perf_counter is CLOCK_MONOTONIC on Linux, one clock for every process.
    """

    async def stream(request: Request) -> StreamingResponse | JSONResponse:
        arrived = time.perf_counter()
        body = await request.json()
        index = re.search(r"\[(\d+)\]", json.dumps(body)).group(1)  # type: ignore[union-attr]
        stamps = sent_at.setdefault(f"bench-{index}", [arrived])  # the planned request's index
        chat = request.url.path.endswith("/chat/completions")

        def chunk(text: str | None, finish: str | None = None) -> bytes:
            if chat:
                delta = {"role": "assistant", "content": ""} if text is None else {"content": text}
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish}
            return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"

        async def events() -> AsyncIterator[bytes]:
            if chat:
                yield chunk(None)  # the role chunk, at once: not a token
            await asyncio.sleep(SCRIPTED_TTFT_S)
            stamps.append(time.perf_counter())
            yield chunk("tok0")
            for index, gap in enumerate(SCRIPTED_GAPS_S, start=1):
                await asyncio.sleep(gap)
                last = index == len(SCRIPTED_GAPS_S)
                stamps.append(time.perf_counter())
                yield chunk(f" tok{index}", "length" if last else None)
            usage = {"prompt_tokens": 12, "completion_tokens": len(SCRIPTED_GAPS_S) + 1}
            yield b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        if not body.get("stream"):
            return JSONResponse({"error": {"message": "stream only"}}, status_code=400)
        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def stamps(request: Request) -> JSONResponse:
        return JSONResponse(sent_at)

    return Starlette(routes=[
        Route("/v1/chat/completions", stream, methods=["POST"]),
        Route("/v1/completions", stream, methods=["POST"]),
        Route("/v1/models", models), Route("/health", health), Route("/stamps", stamps),
    ])  # fmt: skip


def serve_scripted(port: int) -> None:
    import uvicorn

    uvicorn.run(scripted_app({}), host="127.0.0.1", port=port, log_level="warning")
