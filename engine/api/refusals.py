"""How the engine's refusals and failures read to an OpenAI client: each is an `ApiError` with
the status, type and code that OpenAI's clients act on (429 or 503 with a retry-after to back
off, 504 for a deadline, 500 that keeps the engine's exception in the server log)."""

from __future__ import annotations

import math

from engine.api.limits import Deadline
from engine.api.schema import ApiError
from engine.api.state import EngineRequestState
from engine.outputs import (
    EngineOverloaded,
    EngineStepFailed,
    EngineStopped,
    RequestOutput,
    RequestShed,
    RequestTooLarge,
)
from engine.stream import RequestStream


def too_large(error: RequestTooLarge, prompt_param: str) -> ApiError:
    """`prompt_param`: the body's field that holds the prompt ("prompt", or a chat's
    "messages"); the engine names "prompt" or "max_tokens"."""
    param = prompt_param if error.param == "prompt" else error.param
    return ApiError(400, str(error), param=param, code=error.code)


def overloaded(error: EngineOverloaded | EngineStopped) -> ApiError:
    """Shedding: said at once with a time to come back, never a silent drop."""
    retry = str(max(1, math.ceil(getattr(error, "retry_after_s", 1.0))))
    status = 429 if isinstance(error, EngineOverloaded) else 503
    return ApiError(
        status,
        f"the server is overloaded: {error}",
        kind="rate_limit_error" if status == 429 else "server_error",
        code="overloaded",
        headers={"retry-after": retry},
    )


def shed(error: RequestShed) -> ApiError:
    """The scheduler judged the tier's TTFT objective out of reach: said at once, with the
    reason, rather than served late."""
    return ApiError(
        429,
        f"request shed: {error}",
        kind="rate_limit_error",
        code=error.reason,
        headers={"retry-after": str(max(1, math.ceil(error.retry_after_s)))},
    )


def deadline_exceeded(error: TimeoutError) -> ApiError:
    return ApiError(504, str(error), kind="timeout_error", code="deadline_exceeded")


def internal_error(stream: RequestStream) -> ApiError:
    """A generic 500: the engine's exception stays in the server log, never in the body."""
    return ApiError(
        500,
        f"internal error while generating (request id {stream.request_id}); "
        "retry, and report the id if it persists",
        kind="server_error",
        code="internal_error",
    )


async def first_output(
    stream: RequestStream, deadline: Deadline, state: EngineRequestState
) -> RequestOutput:
    """The request's first output within its first-token deadline; an ApiError when the
    scheduler shed it, the deadline passed (the request is cancelled) or the engine failed.
    `state`: the ASGI scope's, where the outcome is written for a middleware in front."""
    try:
        return await deadline.first_output(stream)
    except RequestShed as error:
        state["outcome"] = "shed"
        state["shed_reason"] = error.reason
        raise shed(error) from error
    except TimeoutError as error:
        stream.cancel()
        state["outcome"] = "timeout"
        raise deadline_exceeded(error) from error
    except EngineStepFailed as error:
        raise internal_error(stream) from error
