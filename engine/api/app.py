"""OpenAI-compatible HTTP API for the engine (Starlette). Knows nothing of middleware or SLOs.

Routes: POST /v1/completions, POST /v1/chat/completions (streaming and not, SSE like OpenAI's,
with `usage`), GET /v1/models, GET /health. Errors use OpenAI's JSON shape
`{"error": {"message", "type", "param", "code"}}`; bad input is a 4xx that says what to change.

A middleware in front may set `scope["state"]["priority"]` (int, lower is served first) and
`scope["state"]["request_id"]` (str) for each request; the API passes both to the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.api.limits import Deadline, Limits
from engine.api.openapi import openapi_document
from engine.api.refusals import (
    deadline_exceeded,
    first_output,
    internal_error,
    overloaded,
    too_large,
)
from engine.api.schema import (
    ApiError,
    CompletionRequest,
    parse_chat,
    parse_completion,
    read_json,
)
from engine.api.state import EngineRequestState, engine_request_state
from engine.engine import Engine
from engine.outputs import (
    EngineOverloaded,
    EngineStepFailed,
    EngineStopped,
    RequestOutput,
    RequestTooLarge,
)
from engine.stream import RequestStream

DEFAULT_MAX_BODY_BYTES = 1024 * 1024


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


@dataclass(frozen=True, slots=True)
class Generation:
    """An accepted request on its way out: what the streaming and the one-shot responses need."""

    request: CompletionRequest  # the parsed body
    stream: RequestStream
    first: RequestOutput  # already awaited, within the first-token deadline
    deadline: Deadline
    state: EngineRequestState  # the outcome is written here for a middleware in front


class OpenAIApi:
    def __init__(
        self, engine: Engine, model_name: str, max_body_bytes: int, limits: Limits
    ) -> None:
        self.engine = engine
        self.model_name = model_name
        self.max_body_bytes = max_body_bytes
        self.limits = limits
        self.created = int(time.time())

    # ------------------------------------------------------------------ plain endpoints
    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model_name,
                        "object": "model",
                        "created": self.created,
                        "owned_by": "llm-slo",
                        "max_model_len": self.engine.max_model_len,
                        "scheduling": self.engine.scheduling_settings(),
                    }
                ],
            }
        )

    async def openapi(self, request: Request) -> JSONResponse:
        return JSONResponse(openapi_document(self.model_name))

    async def health(self, request: Request) -> JSONResponse:
        cold = self.engine.cold_start
        ready = self.engine.started
        return JSONResponse(
            {
                "status": "ok" if ready else "starting",
                "model": self.model_name,
                "cold_start_s": None if cold is None else round(cold.total_s, 6),
                "kv_blocks_free": self.engine.num_free_blocks,
                "kv_blocks_total": self.engine.num_blocks,
                "active_requests": self.engine.num_active_requests,
                "scheduling": self.engine.scheduling_settings(),
            },
            status_code=200 if ready else 503,
        )

    # -------------------------------------------------------------- generation endpoints
    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def _generate(self, request: Request, chat: bool) -> Response:
        state = engine_request_state(request.scope)
        started = time.monotonic()
        try:
            parsed, stream = await self._submit(request, chat, state)
            deadline = Deadline(started, self.limits)
            first = await first_output(stream, deadline, state)
        except ApiError as error:
            return error_response(error)
        generation = Generation(parsed, stream, first, deadline, state)
        if parsed.stream:
            return StreamingResponse(
                self._stream_events(generation),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", "x-request-id": stream.request_id},
            )
        return await self._complete(request, generation)

    async def _submit(
        self, request: Request, chat: bool, state: EngineRequestState
    ) -> tuple[CompletionRequest, RequestStream]:
        """The request read, checked and queued in the engine; an ApiError says why it was not
        (bad input, another model, too large, the engine overloaded or stopping)."""
        body = await read_json(request, self.max_body_bytes)
        parsed = parse_chat(body, self.engine) if chat else parse_completion(body, self.engine)
        if parsed.model != self.model_name:
            raise ApiError(
                404,
                f"model '{parsed.model}' does not exist; this server serves '{self.model_name}'",
                param="model",
                code="model_not_found",
                kind="not_found_error",
            )
        try:
            stream = self.engine.submit(
                parsed.prompt_ids,
                parsed.params,
                priority=int(state.get("priority", 0)),
                request_id=state.get("request_id"),
                streaming=parsed.stream,
            )
        except RequestTooLarge as error:
            raise too_large(error, parsed.prompt_param) from error
        except (EngineOverloaded, EngineStopped) as error:
            state["outcome"] = "shed"
            raise overloaded(error) from error
        return parsed, stream

    def _ids(self, stream: RequestStream, chat: bool) -> dict[str, Any]:
        return {
            "id": ("chatcmpl-" if chat else "cmpl-") + stream.request_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
        }

    async def _stream_events(self, generation: Generation) -> AsyncIterator[bytes]:
        stream, state, chat = generation.stream, generation.state, generation.request.chat
        head = self._ids(stream, chat)
        completion_tokens = 0
        try:
            if chat:
                yield sse(
                    {
                        **head,
                        "choices": [
                            {
                                "index": 0,
                                "delta": {"role": "assistant", "content": ""},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ],
                    }
                )
            async for output in generation.deadline.outputs(stream, generation.first):
                completion_tokens = output.completion_tokens
                if not output.text and output.finish_reason is None:
                    continue
                if chat:
                    delta = {"content": output.text} if output.text else {}
                    choice = {
                        "index": 0,
                        "delta": delta,
                        "logprobs": None,
                        "finish_reason": output.finish_reason,
                    }
                else:
                    choice = {
                        "index": 0,
                        "text": output.text,
                        "logprobs": None,
                        "finish_reason": output.finish_reason,
                    }
                yield sse({**head, "choices": [choice]})
            if generation.request.include_usage:
                yield sse(
                    {**head, "choices": [], "usage": usage(stream.prompt_tokens, completion_tokens)}
                )
            yield sse("[DONE]")
        except TimeoutError as error:
            state["outcome"] = "timeout"
            yield sse(deadline_exceeded(error).body())
        except EngineStepFailed:
            state["outcome"] = "server_error"
            yield sse(internal_error(stream).body())
        finally:
            stream.cancel()

    async def _complete(self, request: Request, generation: Generation) -> Response:
        stream, state, chat = generation.stream, generation.state, generation.request.chat
        outputs = generation.deadline.outputs(stream, generation.first)
        collected = asyncio.ensure_future(_collect(outputs, stream))
        disconnected = asyncio.ensure_future(_wait_for_disconnect(request))
        try:
            await asyncio.wait({collected, disconnected}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            disconnected.cancel()
        if not collected.done():  # the client left: stop generating for nobody
            collected.cancel()
            stream.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await collected
            return Response(status_code=499)
        try:
            text, finish_reason, completion_tokens = collected.result()
        except TimeoutError as error:
            state["outcome"] = "timeout"
            return error_response(deadline_exceeded(error))
        except EngineStepFailed:
            return error_response(internal_error(stream))
        head = self._ids(stream, chat)
        if chat:
            head["object"] = "chat.completion"
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return JSONResponse(
            {**head, "choices": [choice], "usage": usage(stream.prompt_tokens, completion_tokens)},
            headers={"x-request-id": stream.request_id},
        )


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


async def _collect(
    outputs: AsyncIterator[RequestOutput], stream: RequestStream
) -> tuple[str, str | None, int]:
    pieces: list[str] = []
    finish_reason: str | None = None
    completion_tokens = 0
    try:
        async for output in outputs:
            pieces.append(output.text)
            finish_reason = output.finish_reason
            completion_tokens = output.completion_tokens
    finally:
        stream.cancel()
    return "".join(pieces), finish_reason, completion_tokens


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    message = {
        404: f"no route {request.url.path}; routes: /v1/completions, /v1/chat/completions, "
        "/v1/models, /health",
        405: f"method {request.method} is not allowed on {request.url.path}",
    }.get(exc.status_code, str(exc.detail))
    return error_response(ApiError(exc.status_code, message, kind=kind))


async def _server_error(request: Request, exc: Exception) -> Response:
    return error_response(
        ApiError(500, "internal server error", kind="server_error", code="internal_error")
    )


def create_app(
    engine: Engine,
    model_name: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    limits: Limits | None = None,
) -> Starlette:
    """The ASGI app; starting it (lifespan) warms the engine up, stopping it stops the engine."""
    api = OpenAIApi(engine, model_name or engine.name, max_body_bytes, limits or Limits())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await engine.start()
        try:
            yield
        finally:
            await engine.stop()

    routes = [
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/openapi.json", api.openapi, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error, Exception: _server_error},
    )
    app.state.engine = engine
    app.state.model_name = api.model_name
    return app
