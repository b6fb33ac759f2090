"""llama.cpp's C++ server (`llama-server`): the `timings` object of its responses.

It rides in plain responses and in the final chunk of a stream (tools/server/server.cpp,
`timings` of the result: `prompt_n`, `prompt_ms`, `predicted_n`, `predicted_ms`, `cache_n`):

- prompt_ms: prefill time of the prompt tokens it did not find in its cache;
- predicted_n / predicted_ms: tokens generated and the time spent generating them;
- cache_n: prompt tokens served from its cache.

It does not report queue time: what precedes prefill before the first token is queue.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from middleware.upstream.registry import EngineAdapter, register
from middleware.upstream.report import UpstreamReport


def _number(value: Any) -> float | None:
    if type(value) in (int, float) and 0 <= value < float("inf"):
        return float(value)
    return None


def read_llamacpp_body(report: UpstreamReport, found: Mapping[str, Any]) -> bool:
    """The `timings` object of a chunk or body, taken into `report`; False when it is not one."""
    timings = found.get("timings")
    if not isinstance(timings, Mapping):
        return False
    apply_timings(report, timings)
    return True


def apply_timings(report: UpstreamReport, timings: Mapping[str, Any]) -> None:
    """Take prefill (and, for a plain response, decode) time and counts from `timings`."""
    prompt_ms = _number(timings.get("prompt_ms"))
    if prompt_ms is not None:
        report.prefill_s = prompt_ms / 1000
    predicted_ms = _number(timings.get("predicted_ms"))
    if predicted_ms is not None:
        report.decode_s = predicted_ms / 1000
    predicted = timings.get("predicted_n")
    # usage, when the engine also sends it, stays the source of the counts.
    if report.tokens_source != "usage" and type(predicted) is int and predicted >= 0:
        report.output_tokens = predicted
        report.tokens_source = "timings"
    cached = timings.get("cache_n")
    if report.cached_tokens is None and type(cached) is int and cached >= 0:
        report.cached_tokens = cached
    prompt_n = timings.get("prompt_n")
    if report.input_tokens is None and type(prompt_n) is int and prompt_n >= 0:
        report.input_tokens = prompt_n + (report.cached_tokens or 0)


# With `--metrics`, its `/metrics` (observed, a 2026 build): busy slots and deferred requests;
# no KV-cache gauge.
LLAMA_CPP = register(
    EngineAdapter(
        name="llamacpp",
        body_keys=("timings",),
        read_body=read_llamacpp_body,
        metrics={
            "llamacpp:requests_processing": "running",
            "llamacpp:requests_deferred": "queue_depth",
            "llamacpp:kv_cache_usage_ratio": "kv_usage",  # older builds only, 0..1
        },
    )
)
