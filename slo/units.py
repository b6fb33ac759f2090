"""Parsing of the quantities people write in an SLO spec: durations, percentages, rates.

Every parser raises `ValueError` with a message that says what was expected; the spec loader
adds the file, line and tier in front of it.
"""

from __future__ import annotations

import math
import re

# Seconds per unit. "m" is minutes (as in Prometheus durations), never milliseconds.
_DURATION_UNITS: dict[str, float] = {
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 7 * 86400.0,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(us|µs|ms|s|m|h|d|w)\s*$")
_NUMBER = re.compile(r"^\s*[-+]?(\d+(?:\.\d+)?|\.\d+)\s*$")
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*%\s*$")


def parse_duration(text: object) -> float:
    """'200ms' -> 0.2, '30d' -> 2592000.0. A bare number has no unit and is refused."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ValueError(f"expected a duration such as 200ms, 1.5s or 30d, got {text!r}")
    if isinstance(text, int | float) or _NUMBER.match(str(text)):
        raise ValueError(
            f"duration {text!r} has no unit; write it with one, e.g. {text}ms or {text}s"
        )
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(
            f"cannot read duration {text!r}; write a number and a unit (us, ms, s, m, h, d, w)"
        )
    seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"duration {text!r} must be greater than zero")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest exact spelling: 0.2 -> '200ms', 2592000 -> '30d', 1.5 -> '1.5s'."""
    for unit, size in (("w", 604800.0), ("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and _is_whole(seconds / size):
            return f"{round(seconds / size)}{unit}"
    if seconds >= 1:
        return f"{_trim(seconds)}s"
    if seconds >= 1e-3:
        return f"{_trim(seconds * 1e3)}ms"
    return f"{_trim(seconds * 1e6)}us"


def parse_fraction(value: object) -> float:
    """'99.9%' -> 0.999; 0.999 -> 0.999; 99.9 (a bare number above 1) is read as percent."""
    if isinstance(value, bool):
        raise ValueError(f"expected a percentage such as 99.9%, got {value!r}")
    if isinstance(value, int | float):
        fraction = float(value) / 100.0 if value > 1 else float(value)
    elif isinstance(value, str) and (match := _PERCENT.match(value)):
        fraction = float(match.group(1)) / 100.0
    elif isinstance(value, str) and _NUMBER.match(value):
        return parse_fraction(float(value))
    else:
        raise ValueError(f"expected a percentage such as 99.9% or 0.999, got {value!r}")
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"target {value!r} must be between 0% and 100% (both excluded)")
    return fraction


def format_percent(fraction: float) -> str:
    """0.999 -> '99.9%'."""
    return f"{_trim(fraction * 100.0)}%"


def _is_whole(value: float) -> bool:
    return abs(value - round(value)) < 1e-9


def _trim(value: float) -> str:
    """Up to six significant decimals, no trailing zeros: 0.2 -> '0.2', 200.0 -> '200'."""
    return f"{value:.6f}".rstrip("0").rstrip(".")
