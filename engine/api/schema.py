"""Validation of OpenAI-style request bodies into engine requests, with errors that say the fix."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.api.fields import CHAT_ROLES, Route, refusal
from engine.sampling import SamplingParams

if TYPE_CHECKING:
    from starlette.requests import Request

    from engine.engine import Engine


class ApiError(Exception):
    """An HTTP error in OpenAI's JSON shape."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass
class CompletionRequest:
    """A validated request body. Whether prompt and max_tokens fit is the engine's check
    (`Engine.check_fits`, at submission), made once for every caller."""

    model: str
    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    chat: bool = False

    @property
    def prompt_param(self) -> str:
        """The body field that carried the prompt, for errors about it."""
        return "messages" if self.chat else "prompt"


async def read_json(request: Request, max_body_bytes: int) -> dict[str, Any]:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_body_bytes:
        raise ApiError(
            413,
            f"request body is {declared} bytes, above the limit of {max_body_bytes}; "
            "send a shorter prompt",
            code="body_too_large",
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body_bytes:
            raise ApiError(
                413,
                f"request body is above the limit of {max_body_bytes} bytes; send a shorter prompt",
                code="body_too_large",
            )
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw:
        raise ApiError(400, "request body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        where = (
            f" at line {error.lineno} column {error.colno}"
            if isinstance(error, json.JSONDecodeError)
            else ""
        )
        raise ApiError(400, f"request body is not valid JSON{where}; send a JSON object") from error
    if not isinstance(body, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(body).__name__}")
    return body


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ApiError(
            400,
            f"'{name}' must be a number between {low:g} and {high:g}, got {value!r}",
            param=name,
        )
    return float(value)


def _integer(
    body: dict[str, Any], name: str, default: int | None, low: int, high: int | None = None
) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise ApiError(400, f"'{name}' must be an integer {bound}, got {value!r}", param=name)
    return value


def _boolean(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false, got {value!r}", param=name)
    return value


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' is required: the name from GET /v1/models", param="model")
    return model


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if (
        not isinstance(stop, list)
        or len(stop) > 4
        or not all(isinstance(s, str) and s for s in stop)
    ):
        raise ApiError(
            400,
            "'stop' must be a non-empty string or a list of up to 4 non-empty strings",
            param="stop",
        )
    return tuple(stop)


def _sampling(
    body: dict[str, Any], engine: Engine, prompt_tokens: int, default_max_tokens: int | None
) -> SamplingParams:
    cap = engine.max_tokens_cap
    max_tokens = _integer(body, "max_completion_tokens", None, 1, None)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", None, 1, None)
    if max_tokens is None:
        room = engine.max_model_len - prompt_tokens
        max_tokens = max(
            1,
            min(cap, room)
            if default_max_tokens is None
            else min(default_max_tokens, cap, max(room, 1)),
        )
    seed = _integer(body, "seed", None, -(2**63), 2**63 - 1)
    defaults = engine.model_config
    params = SamplingParams(
        max_tokens=max_tokens,
        # Unset fields take the checkpoint's generation_config.json defaults.
        temperature=_number(body, "temperature", defaults.default_temperature, 0.0, 2.0),
        top_p=_positive_top_p(body, defaults.default_top_p),
        top_k=_integer(body, "top_k", defaults.default_top_k, 0, None) or 0,
        seed=seed,
        stop=_stop(body),
        ignore_eos=_boolean(body, "ignore_eos", False),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        logit_bias=_logit_bias(body, defaults.vocab_size),
    )
    if params.adjusts_logits and engine.config.draft_model is not None:
        name = next(n for n in _ADJUSTING if body.get(n))
        raise ApiError(
            400,
            f"'{name}' is not applied with speculative decoding (this server runs a draft "
            "model); remove it, or use a server without --draft-model",
            param=name,
        )
    return params


_ADJUSTING = ("logit_bias", "presence_penalty", "frequency_penalty")


def _logit_bias(body: dict[str, Any], vocab_size: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's map of token id (a string) to a bias in [-100, 100]."""
    bias = body.get("logit_bias")
    if bias is None:
        return ()
    fix = f'a map like {{"42": -100}}: token ids 0..{vocab_size - 1} to numbers in [-100, 100]'
    if not isinstance(bias, dict):
        raise ApiError(400, f"'logit_bias' must be {fix}", param="logit_bias")
    pairs: list[tuple[int, float]] = []
    for key, value in bias.items():
        token = int(key) if key.isascii() and key.isdigit() else -1
        good = not isinstance(value, bool) and isinstance(value, int | float)
        if not 0 <= token < vocab_size or not good or not -100 <= value <= 100:
            raise ApiError(
                400,
                f"'logit_bias' entry {json.dumps(key)[:40]}: {json.dumps(value)[:40]} is "
                f"not valid; it must be {fix}",
                param="logit_bias",
            )
        pairs.append((token, float(value)))
    return tuple(pairs)


def check_fields(body: dict[str, Any], route: Route) -> None:
    """A 400 naming the first field this engine does not serve (engine/api/fields.py)."""
    refused = refusal(body, route)
    if refused is not None:
        param, message = refused
        raise ApiError(400, message, param=param, code="unsupported_parameter")


def _positive_top_p(body: dict[str, Any], default: float = 1.0) -> float:
    top_p = _number(body, "top_p", default, 0.0, 1.0)
    if top_p == 0:
        raise ApiError(
            400, "'top_p' must be above 0 (use temperature 0 for greedy decoding)", param="top_p"
        )
    return top_p


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = _boolean(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(
            400,
            "'stream_options' must be an object like {\"include_usage\": true}",
            param="stream_options",
        )
    include_usage = (options or {}).get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise ApiError(
            400,
            "'stream_options.include_usage' must be true or false, "
            f"got {json.dumps(include_usage)[:40]}",
            param="stream_options.include_usage",
        )
    return stream, include_usage


def parse_completion(body: dict[str, Any], engine: Engine) -> CompletionRequest:
    check_fields(body, "completions")
    model = _model(body)
    if "prompt" not in body:
        raise ApiError(
            400, "'prompt' is required: a string (or a list of token ids)", param="prompt"
        )
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        prompt_ids = engine.encode_prompt(prompt)
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        vocab = engine.model_config.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise ApiError(
                400, f"'prompt' token ids must be between 0 and {vocab - 1}", param="prompt"
            )
        prompt_ids = list(prompt)
    else:
        raise ApiError(
            400,
            "'prompt' must be a string, a one-element list of strings, or a list of token ids",
            param="prompt",
        )
    stream, include_usage = _stream_flags(body)
    params = _sampling(body, engine, len(prompt_ids), default_max_tokens=16)
    return CompletionRequest(model, prompt_ids, params, stream, include_usage, chat=False)


def _message_text(message: Any, index: int) -> dict[str, str]:
    if not isinstance(message, dict):
        raise ApiError(
            400,
            f"'messages[{index}]' must be an object with 'role' and 'content'",
            param=f"messages[{index}]",
        )
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise ApiError(
            400,
            f"'messages[{index}].role' must be one of {', '.join(CHAT_ROLES)}, got {role!r}",
            param=f"messages[{index}].role",
        )
    content = message.get("content")
    if isinstance(content, list):
        parts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise ApiError(
                    400,
                    f'\'messages[{index}].content\' parts must be {{"type": "text", "text": ...}}; '
                    "this server takes text only",
                    param=f"messages[{index}].content",
                )
            parts.append(part["text"])
        content = "".join(parts)
    if content is None and role == "assistant":
        content = ""
    if not isinstance(content, str):
        raise ApiError(
            400, f"'messages[{index}].content' must be a string", param=f"messages[{index}].content"
        )
    return {"role": role, "content": content}


def parse_chat(body: dict[str, Any], engine: Engine) -> CompletionRequest:
    check_fields(body, "chat")
    model = _model(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(
            400,
            '\'messages\' is required: a non-empty list of {"role", "content"} objects',
            param="messages",
        )
    normalized = [_message_text(message, index) for index, message in enumerate(messages)]
    prompt_ids = engine.tokenizer.encode_chat(normalized)
    stream, include_usage = _stream_flags(body)
    params = _sampling(body, engine, len(prompt_ids), default_max_tokens=None)
    return CompletionRequest(model, prompt_ids, params, stream, include_usage, chat=True)
