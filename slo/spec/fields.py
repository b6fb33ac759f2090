"""Field readers shared by the spec loader: each reports problems through `fail(line, message)`."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from slo.spec.yamlfile import LineDict, LineList
from slo.units import parse_duration

Fail = Callable[[int, str], NoReturn]
DEFAULT_WINDOW_S = 30 * 86400.0  # a spec's window when it names none


def line_of(container: object, key: Any) -> int:
    if isinstance(container, LineDict):
        return container.line_of(key)
    if isinstance(container, LineList) and isinstance(key, int):
        return container.line_of(key)
    return int(getattr(container, "line", 0))


def check_keys(raw: Mapping[Any, Any], allowed: Sequence[str], what: str, fail: Fail) -> None:
    for key in raw:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"use {', '.join(allowed)}"
            fail(line_of(raw, key), f"unknown {what} key {key!r}; {hint}")


def optional_section(
    raw: object, line: int, name: str, keys: Sequence[str], shape: str, fail: Fail
) -> Mapping[Any, Any] | None:
    """A section the spec may leave out: None when it does, else the mapping, failing when it
    is not one (naming its `shape`) or has a key other than `keys`."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        fail(line, f"'{name}' must be a mapping with {shape}")
    assert isinstance(raw, Mapping)
    check_keys(raw, keys, name, fail)
    return raw


def strings(raw: Mapping[Any, Any], key: str, fail: Fail) -> tuple[str, ...]:
    value = raw.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str | int) for v in value):
        fail(line_of(raw, key), f"'{key}' must be a list of strings, got {value!r}")
    return tuple(str(v) for v in value)


def duration(raw: Mapping[Any, Any], key: str, default: float, fail: Fail) -> float:
    if key not in raw:
        return default
    try:
        return parse_duration(raw[key])
    except ValueError as error:
        fail(line_of(raw, key), f"{key}: {error}")
    raise AssertionError("unreachable")


def positive(raw: Mapping[Any, Any], key: str, fail: Fail) -> float:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        fail(line_of(raw, key), f"{key} must be a number above zero, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def count(raw: Mapping[Any, Any], key: str, default: int, fail: Fail, minimum: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        fail(line_of(raw, key), f"{key} must be a whole number >= {minimum}, got {value!r}")
    return int(value)
