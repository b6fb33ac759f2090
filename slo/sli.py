"""The SLI catalog: the one place that names every indicator and its Prometheus metric (the
engine's entries in `slo.engine_slis`, their buckets in `slo.buckets`, what an entry is in
`slo.indicator`; CATALOG holds them all).

Middleware, dashboards, alert rules, records and `slo check` read names, units, labels and
buckets from here, so they cannot drift apart. Definitions follow `vllm bench serve`:

- ttft: request start to the first output token's bytes handed to the client.
- tpot: per request, (e2e - ttft) / (output_tokens - 1); undefined for one output token.
  (guidellm's "TPOT" divides the whole e2e, TTFT included, by all output tokens.)
- itl: every gap between consecutive output-token chunks; one observation per gap.
- e2e: request start to the last byte sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slo.buckets import (
    OTEL_DURATION_BUCKETS,
    OTEL_TOKEN_BUCKETS,
    OTEL_TPOT_BUCKETS,
    OTEL_TTFT_BUCKETS,
    PHASE_BUCKETS,
)
from slo.engine_slis import ENGINE_SLIS
from slo.engine_slis import SHED_REASONS as SHED_REASONS  # readers import it from here
from slo.indicator import REQUEST_LABELS, SLI, counter, histogram
from slo.indicator import STANDARD_LABELS as STANDARD_LABELS  # readers import it from here

if TYPE_CHECKING:
    from slo.spec import SLOSpec

OUTCOMES: tuple[str, ...] = (
    "ok",
    "client_error",
    "rate_limited",
    "shed",
    "server_error",
    "timeout",
    "cancelled",
)
# Outcomes that say nothing about the service's health: the client sent a bad request or
# walked away. They are left out of availability; every other non-ok outcome counts as bad.
OUTCOMES_EXCLUDED_FROM_AVAILABILITY: tuple[str, ...] = ("client_error", "cancelled")


def outcome_for_status(status: int) -> str:
    """The outcome of a finished HTTP response, by status alone (one mapping for every reader)."""
    if status < 400:
        return "ok"
    if status == 429:
        return "rate_limited"
    if status == 503:
        return "shed"
    if status in (408, 504):
        return "timeout"
    if status == 499:
        return "cancelled"
    return "client_error" if status < 500 else "server_error"


# The additive parts of e2e, in the order a request lives through them: they sum to e2e.
# queue_prefill holds the time before the first token of an engine that does not report queue
# and prefill apart (seen only on the wire); it is never called "other".
PHASES: tuple[str, ...] = (
    "network",
    "queue",
    "prefill",
    "queue_prefill",
    "decode",
    "detokenize",
    "other",
)
# Phases after the first token make up TPOT and ITL; the others (queue_prefill among them) come
# before it and make up TTFT. An engine that reports queue and prefill apart (the bundled one)
# leaves queue_prefill empty: SPLIT_PHASES are what its records hold.
AFTER_FIRST_TOKEN: tuple[str, ...] = ("decode", "detokenize")
BEFORE_FIRST_TOKEN: tuple[str, ...] = tuple(p for p in PHASES if p not in AFTER_FIRST_TOKEN)
SPLIT_PHASES: tuple[str, ...] = tuple(p for p in PHASES if p != "queue_prefill")
# The latency SLIs made of phases: an alert on one of them names the phase to blame.
PHASED_SLIS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2e")
# Where a record's token counts come from, most exact first: the engine's own hooks, the
# `usage` object of the response, llama.cpp's `timings`, or a count of token-bearing chunks.
TOKENS_SOURCES: tuple[str, ...] = ("engine", "usage", "timings", "chunks")

# What every request is measured by: its latencies, its tokens and its outcome.
_SLIS: tuple[SLI, ...] = (
    histogram(
        "ttft",
        "llm_slo_time_to_first_token_seconds",
        "ttft_s",
        "Time to first token: request start to the first output token's bytes sent.",
        OTEL_TTFT_BUCKETS,
    ),
    histogram(
        "tpot",
        "llm_slo_time_per_output_token_seconds",
        "tpot_s",
        "Time per output token after the first: (e2e - ttft) / (output_tokens - 1).",
        OTEL_TPOT_BUCKETS,
    ),
    histogram(
        "itl",
        "llm_slo_inter_token_latency_seconds",
        "itl_s",
        "Inter-token latency: every gap between consecutive output-token chunks.",
        OTEL_TPOT_BUCKETS,
    ),
    histogram(
        "e2e",
        "llm_slo_request_duration_seconds",
        "e2e_s",
        "End-to-end latency: request start to the last byte sent.",
        OTEL_DURATION_BUCKETS,
    ),
    histogram(
        "queue",
        "llm_slo_queue_time_seconds",
        "queue_s",
        "Waiting for a batch slot, preemptions included.",
        PHASE_BUCKETS,
    ),
    histogram(
        "prefill",
        "llm_slo_prefill_time_seconds",
        "prefill_s",
        "Prompt processing up to the first token.",
        PHASE_BUCKETS,
    ),
    histogram(
        "queue_prefill",
        "llm_slo_queue_prefill_time_seconds",
        "queue_prefill_s",
        "Queue and prefill, not split: the engine's time before the first token when "
        "it does not report the two apart (any engine seen only through the wire).",
        PHASE_BUCKETS,
    ),
    histogram(
        "decode",
        "llm_slo_decode_time_seconds",
        "decode_s",
        "First token to last token, detokenization excluded.",
        PHASE_BUCKETS,
    ),
    histogram(
        "detokenize",
        "llm_slo_detokenize_time_seconds",
        "detokenize_s",
        "Turning token ids into text.",
        PHASE_BUCKETS,
    ),
    histogram(
        "network",
        "llm_slo_network_time_seconds",
        "network_s",
        "Receiving the request body and sending the rest after the last token.",
        PHASE_BUCKETS,
    ),
    histogram(
        "other",
        "llm_slo_other_time_seconds",
        "other_s",
        "Parsing, tokenizing and validation: the rest of e2e.",
        PHASE_BUCKETS,
    ),
    SLI(
        "input_tokens",
        "llm_slo_request_input_tokens",
        "histogram",
        "tokens",
        REQUEST_LABELS,
        OTEL_TOKEN_BUCKETS,
        "Prompt tokens per request.",
        "input_tokens",
    ),
    SLI(
        "output_tokens",
        "llm_slo_request_output_tokens",
        "histogram",
        "tokens",
        REQUEST_LABELS,
        OTEL_TOKEN_BUCKETS,
        "Output tokens per request.",
        "output_tokens",
    ),
    SLI(
        "requests",
        "llm_slo_requests_total",
        "counter",
        "requests",
        (*REQUEST_LABELS, "outcome"),
        (),
        "Finished requests by outcome; availability = ok / (all - client_error - cancelled).",
        "outcome",
    ),
    SLI(
        "good_requests",
        "llm_slo_good_requests_total",
        "counter",
        "requests",
        REQUEST_LABELS,
        (),
        "Finished requests that were ok and met every per-request latency objective of "
        "their tier (a missing value passes); goodput = good / (all - client_error - "
        "cancelled).",
        None,
    ),
    SLI(
        "throughput",
        "llm_slo_output_tokens_total",
        "counter",
        "tokens",
        REQUEST_LABELS,
        (),
        "Output tokens generated; its rate is the output throughput.",
        "output_tokens",
    ),
)
# Losses of the observability layer itself: expected to stay 0 (alert when they move).
_LOSSES: tuple[SLI, ...] = (
    counter(
        "records_dropped",
        "llm_slo_records_dropped_total",
        "records",
        None,
        "Request records lost: neither the record store nor its spool file took them.",
    ),
    counter(
        "records_spooled",
        "llm_slo_records_spooled_total",
        "records",
        None,
        "Request records that reached the record store through its local spool file (the "
        "store was out, or its queue full) instead of from memory.",
    ),
    counter(
        "spans_dropped",
        "llm_slo_spans_dropped_total",
        "spans",
        None,
        "Spans dropped because the exporter's queue was full.",
    ),
    # Engine request spans taken at POST /v1/traces (middleware.intake).
    counter(
        "engine_spans_joined",
        "llm_slo_engine_spans_joined_total",
        "spans",
        None,
        "Engine request spans joined to their request's record.",
    ),
    counter(
        "engine_spans_unmatched",
        "llm_slo_engine_spans_unmatched_total",
        "spans",
        None,
        "Engine request spans dropped: no request of ours came for them in time.",
    ),
    counter(
        "engine_spans_duplicate",
        "llm_slo_engine_spans_duplicate_total",
        "spans",
        None,
        "Engine request spans dropped: their request already had one.",
    ),
    counter(
        "engine_span_exports_rejected",
        "llm_slo_engine_span_exports_rejected_total",
        "exports",
        None,
        "Trace exports refused (400, 413, gRPC INVALID_ARGUMENT): not OTLP, malformed, too big.",
    ),
    counter(
        "engine_span_waits_expired",
        "llm_slo_engine_span_waits_expired_total",
        "records",
        None,
        "Requests recorded without their engine span after waiting for it (it never came).",
    ),
)

CATALOG: dict[str, SLI] = {sli.name: sli for sli in (*_SLIS, *ENGINE_SLIS, *_LOSSES)}
LATENCY_SLIS: tuple[str, ...] = tuple(sli.name for sli in CATALOG.values() if sli.is_latency)
# What the middleware, the live windows, the records and the dashboards derive their lists
# from (never re-typed there). A latency SLI's record field is also the attribute of the
# middleware's Breakdown (middleware/request/breakdown.py) that measures it.
LATENCY_FIELDS: dict[str, str] = {
    sli.name: sli.record_field for sli in CATALOG.values() if sli.is_latency and sli.record_field
}
# Latency SLIs with one value per request (ITL has one per gap between tokens).
PER_REQUEST_LATENCY_SLIS: tuple[str, ...] = tuple(
    name for name in LATENCY_SLIS if not CATALOG[name].per_token_gap
)


def _phase_field(phase: str) -> str:
    field = LATENCY_FIELDS.get(phase)
    if field is None:
        raise ValueError(
            f"slo/sli.py: phase {phase!r} of PHASES has no latency SLI in the catalog; "
            "add one with a record_field (every phase is measured, stored and charted)"
        )
    return field


# The record field of each phase, in PHASES order (they sum to e2e_s).
PHASE_FIELDS: tuple[str, ...] = tuple(_phase_field(phase) for phase in PHASES)


def buckets_for(sli_name: str, spec: SLOSpec | None = None) -> tuple[float, ...]:
    """Catalog defaults plus every threshold the spec sets on this SLI, sorted.

    Every SLO threshold is then a bucket boundary, so a histogram answers "what fraction met
    the threshold" exactly instead of interpolating inside a bucket.
    """
    try:
        sli = CATALOG[sli_name]
    except KeyError:
        raise KeyError(f"unknown SLI {sli_name!r}; known: {', '.join(CATALOG)}") from None
    boundaries = set(sli.default_buckets)
    if spec is not None:
        boundaries.update(spec.thresholds_for(sli_name))
    return tuple(sorted(boundaries))
