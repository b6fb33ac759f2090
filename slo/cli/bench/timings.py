"""The server's own timings as it hands them to clients, parsed back into record fields.

Two carriers (written by `middleware.core`): a `Server-Timing` header on non-streamed
responses (milliseconds, the W3C format) and a final SSE comment on streams,
`: llm-slo-timings {"e2e_s": ..., "ttft_s": ..., ...}` (seconds, JSON).
"""

from __future__ import annotations

import json
import math
from typing import Any

from slo.sli import PHASES

TIMINGS_COMMENT_PREFIX = ": llm-slo-timings "
_KNOWN = {*PHASES, "ttft", "e2e"}


def parse_server_timing(value: str | None) -> dict[str, float]:
    """`network;dur=0.7, queue;dur=2.2, ..., e2e;dur=20.0` -> {"network_s": 0.0007, ...}.

    Entries we do not know, and entries without a usable `dur`, are skipped: other
    middleware (a CDN, a framework) may add its own metrics to the same header.
    """
    timings: dict[str, float] = {}
    for entry in (value or "").split(","):
        name, *params = (part.strip() for part in entry.split(";"))
        if name not in _KNOWN:
            continue
        for param in params:
            key, _, raw = param.partition("=")
            if key.strip() != "dur":
                continue
            try:
                millis = float(raw.strip().strip('"'))
            except ValueError:
                break
            if math.isfinite(millis) and millis >= 0:
                timings[f"{name}_s"] = round(millis / 1000.0, 9)  # no float noise from ms->s
            break
    return timings


def parse_timings_comment(line: str) -> dict[str, Any] | None:
    """The JSON of a `: llm-slo-timings {...}` SSE line; None for any other line."""
    if not line.startswith(TIMINGS_COMMENT_PREFIX):
        return None
    try:
        data = json.loads(line[len(TIMINGS_COMMENT_PREFIX) :])
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    timings: dict[str, Any] = {}
    for key, value in data.items():
        if key == "output_tokens":
            if type(value) is int and value >= 0:
                timings[key] = value
        elif (
            key.endswith("_s")
            and key[:-2] in _KNOWN
            and type(value) in (int, float)
            and math.isfinite(value)
            and value >= 0
        ):
            timings[key] = float(value)
    return timings
