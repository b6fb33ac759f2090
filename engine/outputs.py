"""What the engine hands back to callers: outputs, cold start, totals, and its typed errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """One streamed piece of a request: the new text and token ids since the previous piece.

    The last piece has `finish_reason` set ("stop", "length", "cancelled" or "error"; a shed
    request ends with the RequestShed error instead).
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


class EngineError(RuntimeError):
    """Base class of the engine's typed errors."""


class EngineOverloaded(EngineError):
    """The waiting queue is full; retry after `retry_after_s` seconds."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RequestShed(EngineOverloaded):
    """The scheduler dropped a waiting request (`reason`, e.g. "ttft_out_of_reach": its tier's
    TTFT objective can no longer be met); the API answers 429 with the reason."""

    def __init__(self, message: str, reason: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message, retry_after_s)
        self.reason = reason


class RequestTooLarge(EngineError, ValueError):
    """The prompt is empty, or prompt plus max_tokens does not fit the model's context or the
    KV cache. `param` names what to change ("prompt" or "max_tokens"); `code` is OpenAI's
    ("context_length_exceeded"), None for an empty prompt."""

    def __init__(
        self,
        message: str,
        param: Literal["prompt", "max_tokens"],
        code: str | None = "context_length_exceeded",
    ) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class EngineStepFailed(EngineError):
    """A forward pass failed; the requests in that batch end with finish_reason 'error'."""


class EngineStopped(EngineError):
    """The engine was shut down."""
