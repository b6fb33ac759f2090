"""Every request field of OpenAI's chat and completions APIs, and what this engine does with it:
honoured, refused with a 400 that names it, or accepted and ignored (no meaning here), and why.

One registry: the parser checks bodies against it (`refusal`), the OpenAPI document takes its
schemas from it, and docs/openai-fields.md is its table (`markdown_table`; a test keeps them
equal and checks the registry against the `openai` package's own request types). Pure data and
predicates: no torch, no web framework.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Route = Literal["chat", "completions"]
Disposition = Literal["honoured", "refused", "ignored"]
BOTH: frozenset[Route] = frozenset(("chat", "completions"))
CHAT: frozenset[Route] = frozenset(("chat",))
COMPLETIONS: frozenset[Route] = frozenset(("completions",))
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
PATHS: dict[Route, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def _never(value: Any) -> bool:
    return value is None


def _is(*allowed: Any) -> Callable[[Any], bool]:
    """Accepts null and each of `allowed` (a number equals a number, but true is not 1)."""
    return lambda value: value is None or any(_same(value, option) for option in allowed)


def _same(value: Any, option: Any) -> bool:
    if isinstance(value, bool) or isinstance(option, bool):
        return type(value) is type(option) and value == option
    if isinstance(value, int | float) and isinstance(option, int | float):
        return value == option
    return type(value) is type(option) and bool(value == option)


def _typed(*types: type) -> Callable[[Any], bool]:
    """Accepts null and values of these JSON types (bool is not a number here)."""
    return lambda value: (
        value is None
        or (isinstance(value, types) and (bool in types or not isinstance(value, bool)))
    )


@dataclass(frozen=True)
class Field:
    """One request field. `accepts`: for a refused field, the values that ask for nothing
    (null, n=1, logprobs false), served as usual; for an ignored one, the JSON type it must
    have. `schema`: its JSON Schema in our OpenAPI document. `openai`: False for another
    server's extension."""

    name: str
    routes: frozenset[Route]
    disposition: Disposition
    why: str
    schema: dict[str, Any]
    accepts: Callable[[Any], bool] = _never
    accepted: str = ""  # the accepted values of a refused field, as the table says them
    openai: bool = True


_INT = {"type": "integer"}
_NUM = {"type": "number"}
_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_OBJ = {"type": "object"}
_ARR = {"type": "array"}
_TOOLS = "tool calls need a grammar-constrained decoder and a chat template with tools"


def _honoured(name: str, routes: frozenset[Route], why: str, schema: dict[str, Any]) -> Field:
    return Field(name, routes, "honoured", why, schema)


def _refused(
    name: str,
    routes: frozenset[Route],
    why: str,
    schema: dict[str, Any],
    accepted: tuple[Any, ...] = (),
    openai: bool = True,
) -> Field:
    shown = ", ".join(["null", *(_json(value) for value in accepted)])
    return Field(name, routes, "refused", why, schema, _is(*accepted), shown, openai)


def _ignored(
    name: str, routes: frozenset[Route], why: str, schema: dict[str, Any], *types: type
) -> Field:
    return Field(name, routes, "ignored", why, schema, _typed(*types))


def _json(value: Any) -> str:
    return json.dumps(value)


FIELDS: tuple[Field, ...] = (
    _honoured("model", BOTH, "must name the served model (GET /v1/models); another is a 404", _STR),
    _honoured(
        "messages", CHAT, "text content only (strings or text parts)", {**_ARR, "minItems": 1}
    ),
    _honoured("prompt", COMPLETIONS, "a string, a one-string list or a list of token ids", {}),
    _honoured("max_tokens", BOTH, "capped by the server's max tokens", {**_INT, "minimum": 1}),
    _honoured(
        "max_completion_tokens", BOTH, "same as max_tokens; wins over it", {**_INT, "minimum": 1}
    ),
    _honoured("temperature", BOTH, "0 is greedy", {**_NUM, "minimum": 0, "maximum": 2}),
    _honoured("top_p", BOTH, "nucleus sampling", {**_NUM, "exclusiveMinimum": 0, "maximum": 1}),
    _honoured("stream", BOTH, "server-sent events, as OpenAI's", _BOOL),
    _honoured(
        "stream_options",
        BOTH,
        "include_usage honoured; include_obfuscation ignored (no padding is added)",
        {**_OBJ, "properties": {"include_usage": _BOOL, "include_obfuscation": _BOOL}},
    ),
    _honoured(
        "stop",
        BOTH,
        "up to 4 strings; the text ends before the first one generated",
        {"oneOf": [_STR, {**_ARR, "items": _STR, "maxItems": 4}]},
    ),
    _honoured("seed", BOTH, "a generator of the request's own: same seed, same text", _INT),
    _honoured(
        "presence_penalty",
        BOTH,
        "each generated token's logit drops by it once (the prompt is not counted)",
        {**_NUM, "minimum": -2, "maximum": 2},
    ),
    _honoured(
        "frequency_penalty",
        BOTH,
        "each token's logit drops by it times its count in the generated text",
        {**_NUM, "minimum": -2, "maximum": 2},
    ),
    _honoured(
        "logit_bias",
        BOTH,
        "token id (a string) to a bias in [-100, 100] added to its logit; -100 bans, 100 forces",
        {**_OBJ, "additionalProperties": {**_NUM, "minimum": -100, "maximum": 100}},
    ),
    _refused("n", BOTH, "one choice per request; send several requests", _INT, (1,)),
    _refused(
        "logprobs",
        BOTH,
        "token log-probabilities are not returned",
        {"type": ["boolean", "integer"]},
        (False, 0),
    ),
    _refused("top_logprobs", CHAT, "token log-probabilities are not returned", _INT, (0,)),
    _refused("echo", COMPLETIONS, "the prompt is not echoed back", _BOOL, (False,)),
    _refused("best_of", COMPLETIONS, "one candidate per request", _INT, (1,)),
    _refused("suffix", COMPLETIONS, "no fill-in-the-middle", _STR, ("",)),
    _refused("tools", CHAT, _TOOLS, {**_ARR, "items": _OBJ}, ([],)),
    _refused("tool_choice", CHAT, _TOOLS, {"oneOf": [_STR, _OBJ]}, ("none",)),
    _refused("functions", CHAT, _TOOLS + " (deprecated form)", {**_ARR, "items": _OBJ}, ([],)),
    _refused(
        "function_call", CHAT, _TOOLS + " (deprecated form)", {"oneOf": [_STR, _OBJ]}, ("none",)
    ),
    _refused(
        "response_format",
        CHAT,
        "JSON mode and JSON schemas need a constrained decoder; plain text only",
        _OBJ,
        ({"type": "text"},),
    ),
    _refused("modalities", CHAT, "text output only", {**_ARR, "items": _STR}, (["text"],)),
    _refused("audio", CHAT, "text output only", _OBJ),
    _refused("reasoning_effort", CHAT, "not a reasoning model", _STR, ("none",)),
    _refused("verbosity", CHAT, "no verbosity control", _STR),
    _refused("web_search_options", CHAT, "no web search", _OBJ),
    _refused("moderation", CHAT, "no moderation model runs here", _OBJ),
    _ignored("user", BOTH, "an end-user id for abuse monitoring: nothing here reads it", _STR, str),
    _ignored("safety_identifier", CHAT, "an end-user id for abuse monitoring, as user", _STR, str),
    _ignored("metadata", CHAT, "tags for stored completions; nothing is stored", _OBJ, dict),
    _ignored("store", CHAT, "this server stores no completions", _BOOL, bool),
    _ignored(
        "service_tier",
        CHAT,
        "billing tier; a request's priority comes from its tier (API key or header)",
        _STR,
        str,
    ),
    _ignored(
        "prompt_cache_key",
        CHAT,
        "prefix caching matches prompts by content, with or without a key",
        _STR,
        str,
    ),
    _ignored("prompt_cache_options", CHAT, "as prompt_cache_key", _OBJ, dict),
    _ignored("prompt_cache_retention", CHAT, "as prompt_cache_key", _STR, str),
    _ignored("prediction", CHAT, "a latency hint: the answer is the same without it", _OBJ, dict),
    _ignored(
        "parallel_tool_calls", CHAT, "only matters with tools, which are refused", _BOOL, bool
    ),
    Field(
        "top_k",
        BOTH,
        "honoured",
        "sample from the k likeliest (0: off), as vLLM's",
        _INT,
        openai=False,
    ),
    Field(
        "ignore_eos",
        BOTH,
        "honoured",
        "generate max_tokens exactly, as vLLM's",
        _BOOL,
        openai=False,
    ),
)
# Other servers' sampling extensions, named so that their refusal says why.
FIELDS += tuple(
    _refused(name, BOTH, f"vLLM's {name} is not implemented", _NUM, accepted, openai=False)
    for name, accepted in (
        ("min_p", (0,)),
        ("repetition_penalty", (1,)),
        ("min_tokens", (0,)),
    )
)

BY_ROUTE: dict[Route, dict[str, Field]] = {
    route: {field.name: field for field in FIELDS if route in field.routes}
    for route in ("chat", "completions")
}


def refusal(body: dict[str, Any], route: Route) -> tuple[str, str] | None:
    """(param, message) for the first field of `body` this engine will not serve, or None.
    Refused and unknown fields come before an ignored field of the wrong type, so a 400 for a
    body that asks for something refused always names what was refused."""
    fields = BY_ROUTE[route]
    for name, value in body.items():
        field = fields.get(name)
        if field is None:
            other: Route = "completions" if route == "chat" else "chat"
            where = f" (it belongs to {PATHS[other]})" if name in BY_ROUTE[other] else ""
            return name, (
                f"'{name[:80]}' is not a request field of {PATHS[route]}{where}; remove it "
                "(docs/openai-fields.md lists the fields this server takes)"
            )
        if field.disposition == "refused" and not field.accepts(value):
            return name, (
                f"'{name}' is not supported by this server: {field.why}; "
                f"remove it or send {field.accepted}"
            )
    for name, value in body.items():
        field = fields[name]
        if field.disposition == "ignored" and not field.accepts(value):
            kind = field.schema.get("type", "value")
            article = "an" if kind[0] in "aeiou" else "a"
            return name, f"'{name}' must be {article} {kind} or null, got {_json(value)[:80]}"
    options = body.get("stream_options")
    if isinstance(options, dict):
        for key in options:
            if key not in ("include_usage", "include_obfuscation"):
                return f"stream_options.{key}", (
                    f"'stream_options.{key[:80]}' is not an option; use include_usage"
                )
    return None


def markdown_table() -> str:
    """The table of docs/openai-fields.md: one row per field, OpenAI's first."""
    lines = [
        "| field | chat | completions | what this engine does | why |",
        "|---|---|---|---|---|",
    ]
    for field in sorted(FIELDS, key=lambda f: (not f.openai, f.name)):
        does: str = field.disposition
        if field.disposition == "refused":
            does = f"refused (400) unless {field.accepted}"
        name = f"`{field.name}`" + ("" if field.openai else " (extension)")
        chat = "yes" if "chat" in field.routes else "-"
        completions = "yes" if "completions" in field.routes else "-"
        lines.append(f"| {name} | {chat} | {completions} | {does} | {field.why} |")
    lines.append(
        "| any other field | - | - | refused (400) | an unknown field may ask for something "
        "this engine does not do |"
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
