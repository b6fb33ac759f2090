"""What the engine hands back to callers, and the errors it raises at submission."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """One streamed piece of a request: the new text and token ids since the previous piece.

    The last piece has `finish_reason` set ("stop", "length", "cancelled" or "error").
    """

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class EngineError(RuntimeError):
    """Base class of the engine's typed errors."""


class EngineOverloaded(EngineError):
    """The waiting queue is full; retry after `retry_after_s` seconds."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RequestTooLarge(EngineError, ValueError):
    """Prompt plus max_tokens does not fit the model's context or the KV cache."""


class EngineStepFailed(EngineError):
    """A forward pass failed; the requests in that batch end with finish_reason 'error'."""


class EngineStopped(EngineError):
    """The engine was shut down."""
