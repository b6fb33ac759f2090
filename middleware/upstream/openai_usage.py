"""The OpenAI `usage` object: exact token counts, whenever an engine sends it.

{"prompt_tokens": 12, "completion_tokens": 16, "total_tokens": 28,
 "prompt_tokens_details": {"cached_tokens": 8}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from middleware.upstream.report import UpstreamReport


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def apply_usage(report: UpstreamReport, usage: Mapping[str, Any]) -> None:
    """Take the counts of a `usage` object: usage wins over every other source."""
    completion = _count(usage.get("completion_tokens"))
    if completion is not None:
        report.output_tokens = completion
        report.tokens_source = "usage"
    prompt = _count(usage.get("prompt_tokens"))
    if prompt is not None:
        report.input_tokens = prompt
    details = usage.get("prompt_tokens_details")
    if isinstance(details, Mapping):
        cached = _count(details.get("cached_tokens"))
        if cached is not None:
            report.cached_tokens = cached
