"""llama-cpp-python's own FastAPI server, for `uvicorn --factory` in a child process.

`create_app` serves the GGUF named by `LLM_SLO_TEST_GGUF`. With `LLM_SLO_TEST_STORE` set,
`LatencyMiddleware` (usage injection on) is mounted around it and records go there (the first
mounting); without it, the bare server is the upstream of `slo proxy` (the second).

Between the engine and whatever wraps it sits `FirstTextProbe`. It holds back the first body
message that carries text by `LLM_SLO_TEST_FIRST_TEXT_DELAY_S` (so the chat role chunk goes
out well before the first text, as it does on OpenAI's API and vLLM), then notes when it
handed that text on, counted from when the request reached it, as one JSON line in
`LLM_SLO_TEST_FIRST_TEXT_LOG`. Whatever measures outside it started earlier and sees the
text later: its TTFT can be no smaller than the probe's, and a TTFT taken at the role chunk
would be smaller by the delay.

With `LLM_SLO_TEST_END_DELAY_S`, the probe also holds back the end of a stream (the last,
empty body message after `data: [DONE]`), as a busy server or a network hop does. The
official `openai` client closes the connection as soon as it reads `[DONE]`, so the client
leaves before the response ends, having received everything.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from middleware.config import MiddlewareConfig

LLM_ROUTES = ("/v1/completions", "/v1/chat/completions")


def body_has_text(body: bytes) -> bool:
    """Whether an SSE or JSON body carries generated text (role, finish and [DONE] do not)."""
    text = body.decode("utf-8", errors="replace").strip()
    if not text:
        return False
    if text.startswith("{"):
        documents = [text]
    else:
        documents = [
            line[len("data:") :].strip()
            for line in text.splitlines()
            if line.startswith("data:") and line[len("data:") :].strip() != "[DONE]"
        ]
    for document in documents:
        try:
            data = json.loads(document)
        except json.JSONDecodeError:
            continue
        for choice in data.get("choices") or []:
            message = choice.get("delta") or choice.get("message") or {}
            if choice.get("text") or message.get("content"):
                return True
    return False


class FirstTextProbe:
    def __init__(self, app: ASGIApp, log_path: str, delay_s: float, end_delay_s: float) -> None:
        self.app = app
        self.log_path = log_path
        self.delay_s = delay_s
        self.end_delay_s = end_delay_s
        self._lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in LLM_ROUTES:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        first_text_s: float | None = None
        streamed = False

        async def probed_send(message: Message) -> None:
            nonlocal first_text_s, streamed
            if message["type"] == "http.response.start":
                streamed = any(
                    name.lower() == b"content-type" and value.startswith(b"text/event-stream")
                    for name, value in message.get("headers", ())
                )
            if (
                first_text_s is None
                and message["type"] == "http.response.body"
                and body_has_text(message.get("body", b""))
            ):
                await asyncio.sleep(self.delay_s)
                first_text_s = time.perf_counter() - started
            if (
                streamed
                and self.end_delay_s
                and message["type"] == "http.response.body"
                and not message.get("more_body", False)
            ):
                await asyncio.sleep(self.end_delay_s)
            await send(message)

        try:
            await self.app(scope, receive, probed_send)
        finally:
            line = json.dumps({"path": scope["path"], "first_text_s": first_text_s})
            with self._lock, open(self.log_path, "a", encoding="utf-8") as log:
                log.write(line + "\n")


def create_app() -> Any:
    from llama_cpp.server.app import create_app as create_llama_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    # interrupt_requests=False: by default llama-cpp-python cuts a stream short with [DONE]
    # as soon as another request waits for the model, and the token counts of a burst would
    # then depend on timing.
    app: Any = create_llama_app(
        server_settings=ServerSettings(interrupt_requests=False),
        model_settings=[
            ModelSettings(
                model=os.environ["LLM_SLO_TEST_GGUF"],
                model_alias="tiny-llama",
                n_ctx=512,
                n_threads=1,
                n_threads_batch=1,
                verbose=False,
            )
        ],
    )
    app = FirstTextProbe(
        app,
        os.environ["LLM_SLO_TEST_FIRST_TEXT_LOG"],
        float(os.environ.get("LLM_SLO_TEST_FIRST_TEXT_DELAY_S", "0.05")),
        float(os.environ.get("LLM_SLO_TEST_END_DELAY_S", "0")),
    )
    store = os.environ.get("LLM_SLO_TEST_STORE")
    if store:
        from middleware import LatencyMiddleware

        # inject_usage: streamed requests ask the engine for usage on the client's behalf.
        # llama-cpp-python accepts stream_options and still sends none, so the counts stay
        # chunk-based; the client must see exactly what it would have seen without it.
        app = LatencyMiddleware(
            app, store=store, model="tiny-llama", config=MiddlewareConfig.of(inject_usage=True)
        )
    return app
