"""Requests that ask the bundled engine for what it refuses, written out by hand (not derived
from engine/api/fields.py, so a field dropped from the registry or turned lenient fails)."""

from __future__ import annotations

from typing import Any

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}

# field -> (route, a value that asks for something the engine does not do)
REFUSED: dict[str, tuple[str, Any]] = {
    "n": ("chat", 2),
    "logprobs": ("chat", True),
    "top_logprobs": ("chat", 3),
    "echo": ("completions", True),
    "best_of": ("completions", 3),
    "suffix": ("completions", "\n}"),
    "tools": ("chat", [WEATHER_TOOL]),
    "tool_choice": ("chat", "required"),
    "functions": ("chat", [WEATHER_TOOL["function"]]),
    "function_call": ("chat", {"name": "get_weather"}),
    "response_format": (
        "chat",
        {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True},
        },
    ),
    "modalities": ("chat", ["text", "audio"]),
    "audio": ("chat", {"voice": "alloy", "format": "wav"}),
    "reasoning_effort": ("chat", "high"),
    "verbosity": ("chat", "low"),
    "web_search_options": ("chat", {"search_context_size": "low"}),
    "moderation": ("chat", {"model": "omni-moderation-latest"}),
    "min_p": ("chat", 0.1),
    "repetition_penalty": ("completions", 1.2),
    "min_tokens": ("completions", 4),
}

# More refusals of the same fields: other routes and other shapes.
MORE_REFUSED: list[tuple[str, str, Any]] = [
    ("logprobs", "completions", 2),
    ("n", "completions", 3),
    ("response_format", "chat", {"type": "json_object"}),
    ("tool_choice", "chat", {"type": "function", "function": {"name": "get_weather"}}),
]

# Values that ask for nothing more than plain generation: served as usual.
ACCEPTED: list[tuple[str, str, Any]] = [
    ("n", "chat", 1),
    ("logprobs", "chat", False),
    ("logprobs", "completions", 0),
    ("echo", "completions", False),
    ("tools", "chat", []),
    ("tool_choice", "chat", "none"),
    ("response_format", "chat", {"type": "text"}),
    ("modalities", "chat", ["text"]),
    ("user", "chat", "user-1234"),
    ("user", "completions", "user-1234"),
    ("metadata", "chat", {"team": "search"}),
    ("store", "chat", False),
    ("service_tier", "chat", "auto"),
    ("prompt_cache_key", "chat", "k"),
    ("safety_identifier", "chat", "hashed-id"),
    ("parallel_tool_calls", "chat", True),
    ("prediction", "chat", {"type": "content", "content": "hello"}),
    ("stream_options", "chat", {"include_usage": True, "include_obfuscation": False}),
]


def body(route: str, extra: dict[str, Any], model: str) -> dict[str, Any]:
    """A small request on `route` with `extra` fields."""
    if route == "chat":
        return {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
        } | extra
    return {"model": model, "prompt": "hi", "max_tokens": 2} | extra
