"""What the middleware reports about one finished request: its record, span attributes, and
server timings for the client."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import middleware.hotpath as hotpath
from middleware.otel.request import GenAIRequest
from middleware.request.arrival import arrival_fields
from middleware.request.breakdown import measured_fields
from middleware.request.timeline import Breakdown
from slo.records import FIELD_NAMES, LIST_FIELDS
from slo.sli import LATENCY_FIELDS, PHASE_FIELDS, PHASES

if TYPE_CHECKING:
    from middleware.request.measured import MeasuredRequest


# %-formatted in one step from a template made once. "%.3f" rounds exactly as round(value, 3)
# does (both correctly rounded), so a reader gets the same numbers as from the rounded values,
# for a fraction of the cost (float repr is slow). The timings comment does the same at 6
# places ("%.6f"), in C where the hot path is built.
_SERVER_TIMING = ", ".join(f"{name};dur=%.3f" for name in PHASES)


def server_timing_value(breakdown: Breakdown) -> str:
    """A `Server-Timing` value in milliseconds (the standard header browsers and tools read)."""
    value = _SERVER_TIMING % tuple(seconds * 1000 for seconds in breakdown.phase_seconds)
    if breakdown.ttft_s is not None:
        value += ", ttft;dur=%.3f" % (breakdown.ttft_s * 1000)
    return value + ", e2e;dur=%.3f" % (breakdown.e2e_s * 1000)


def timings_comment(breakdown: Breakdown) -> bytes:
    """The final SSE comment (`: ...`) carrying the server's timings; SSE clients ignore comments.

    Compact JSON: the phases (`Breakdown.phase_seconds`, under their record fields), e2e and TTFT
    in seconds to the microsecond, then output_tokens (written in C where the hot path is
    built: `middleware.hotpath.timings_comment`).
    """
    return hotpath.timings_comment(breakdown, PHASE_FIELDS, breakdown.phase_seconds)


# The record takes every Breakdown field under its own name (a latency SLI's record field is
# the Breakdown attribute measuring it: slo.sli.LATENCY_FIELDS), so a new SLI needs no line
# here. A response that produced no tokens keeps the timeline's cuts (e2e and its phases) and
# nothing about tokens.
_BREAKDOWN_FIELDS = measured_fields()
_CUT_FIELDS = (LATENCY_FIELDS["e2e"], *PHASE_FIELDS)
_NOT_PRODUCED: dict[str, Any] = {
    **dict.fromkeys(name for name in LATENCY_FIELDS.values() if name not in _CUT_FIELDS),
    "output_tokens": 0,
    "tokens_source": None,
}
_LIST_FIELDS = tuple(name for name in _BREAKDOWN_FIELDS if name in LIST_FIELDS)  # tuples there


def kept_without_tokens(field: str) -> bool:
    """Whether the record of a response that produced no tokens keeps this breakdown field
    (`record_fields`: the timeline's cuts, e2e and the phases). Goodput is decided on what the
    record keeps, so the good-requests counter and the live windows judge as the records do."""
    return field not in _NOT_PRODUCED


# Every field in the record's order, None until set (the client's view stays None here:
# `slo bench` fills it), and the Breakdown's defaults (`Breakdown._of` may leave them out of
# the instance's dict).
_EMPTY_RECORD: dict[str, Any] = {
    **dict.fromkeys(FIELD_NAMES),
    **{
        field.name: field.default
        for field in dataclasses.fields(Breakdown)
        if field.default is not dataclasses.MISSING
    },
}


def record_fields(
    request: MeasuredRequest,
    breakdown: Breakdown,
    model: str,
    trace_id: str | None,
    produced: bool,
) -> dict[str, Any]:
    """One record of a settled request as a plain dict with every field (the store takes
    dicts; cheap to build)."""
    timeline = request.timeline
    clock_start, before_app_s, connection_s = arrival_fields(timeline)
    # One literal merging the breakdown's own dict (C speed: as fast as naming every field).
    record = {
        **_EMPTY_RECORD,
        **vars(breakdown),
        "request_id": timeline.request_id,
        "trace_id": trace_id,
        "timestamp": timeline.wall_start_s,
        "tier": request.tier,
        "model": model,
        "route": request.route,
        "outcome": request.outcome,
        "status_code": request.status,
        "stream": request.exchange.is_stream,
        "input_tokens": timeline.input_tokens,
        "cached_tokens": timeline.cached_tokens,
        "clock_start": clock_start,
        "before_app_s": before_app_s,
        "connection_s": connection_s,
        "delay_blame": timeline.delay_blame,
    }
    if produced:
        for name in _LIST_FIELDS:
            record[name] = list(record[name])
    else:
        record.update(_NOT_PRODUCED)
    return record


def span_attributes(
    genai_request: GenAIRequest,
    request: MeasuredRequest,
    breakdown: Breakdown,
    output_tokens: int,
) -> dict[str, Any]:
    """The request span's attributes: the GenAI conventions' (`middleware.otel.request`), HTTP
    server ones, and ours under `llm_slo.*` (the phases are the child spans)."""
    timeline = request.timeline
    attributes = genai_request.span_attributes(timeline.input_tokens, output_tokens)
    attributes["http.request.method"] = "POST"
    attributes["http.route"] = request.route
    attributes["http.response.status_code"] = request.status
    if genai_request.stream and breakdown.ttft_s is not None:
        attributes["gen_ai.response.time_to_first_chunk"] = breakdown.ttft_s
    if timeline.cached_tokens:
        attributes["gen_ai.usage.cache_read.input_tokens"] = timeline.cached_tokens
    attributes["llm_slo.request_id"] = timeline.request_id
    attributes["llm_slo.tier"] = request.tier
    attributes["llm_slo.outcome"] = request.outcome
    attributes["llm_slo.stream"] = genai_request.stream
    attributes["llm_slo.tokens_source"] = breakdown.tokens_source
    if breakdown.ttft_s is not None:
        attributes["llm_slo.ttft_s"] = breakdown.ttft_s
    return attributes
