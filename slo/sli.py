"""The SLI catalog: the one place that names every indicator and its Prometheus metric.

Middleware, dashboards, alert rules, records and `slo check` read names, units, labels and
buckets from here, so they cannot drift apart. Definitions follow `vllm bench serve`:

- ttft: request start to the first output token's bytes handed to the client.
- tpot: per request, (e2e - ttft) / (output_tokens - 1); undefined for one output token.
  (guidellm's "TPOT" divides the whole e2e, TTFT included, by all output tokens.)
- itl: every gap between consecutive output-token chunks; one observation per gap.
- e2e: request start to the last byte sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from slo.spec import SLOSpec

Kind = Literal["histogram", "counter", "gauge"]

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
    "network", "queue", "prefill", "queue_prefill", "decode", "detokenize", "other",
)  # fmt: skip
# Where a record's token counts come from, most exact first: the engine's own hooks, the
# `usage` object of the response, llama.cpp's `timings`, or a count of token-bearing chunks.
TOKENS_SOURCES: tuple[str, ...] = ("engine", "usage", "timings", "chunks")

STANDARD_LABELS: tuple[str, ...] = ("tier", "model", "route")
_REQUEST_LABELS = STANDARD_LABELS
_ENGINE_LABELS: tuple[str, ...] = ("model",)

# OpenTelemetry GenAI semantic conventions (explicit bucket boundary advisories) are the base.
OTEL_TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
OTEL_TPOT_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
OTEL_DURATION_BUCKETS: tuple[float, ...] = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
OTEL_TOKEN_BUCKETS: tuple[float, ...] = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip
# Phases of one request are often sub-millisecond on a warm engine: finer at the low end.
PHASE_BUCKETS: tuple[float, ...] = (
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0,
)  # fmt: skip
COLD_START_BUCKETS: tuple[float, ...] = (1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300)
# Prefill chunks in one scheduler step (chunked prefill under a token budget).
CHUNK_BUCKETS: tuple[float, ...] = (0, 1, 2, 4, 8, 16, 32, 64)
# Why the engine's scheduler shed a request (a 429, outcome "shed"): its tier's TTFT objective
# was out of reach (the slo policy), or the waiting queue was full.
SHED_REASONS: tuple[str, ...] = ("ttft_out_of_reach", "queue_full")
_TIER_ENGINE_LABELS: tuple[str, ...] = ("tier", "model")


@dataclass(frozen=True, slots=True)
class SLI:
    """One indicator: what it measures and the metric that carries it."""

    name: str
    metric: str
    kind: Kind
    unit: str
    labels: tuple[str, ...]
    default_buckets: tuple[float, ...]
    description: str
    record_field: str | None

    @property
    def is_latency(self) -> bool:
        """Whether an objective like `p95 <name> <= 200ms` makes sense for this SLI."""
        return self.kind == "histogram" and self.unit == "seconds" and self.record_field is not None

    @property
    def per_token_gap(self) -> bool:
        """ITL observes every gap between tokens, not one value per request."""
        return self.name == "itl"


def _histogram(
    name: str, metric: str, field: str | None, description: str, buckets: tuple[float, ...]
) -> SLI:
    return SLI(name, metric, "histogram", "seconds", _REQUEST_LABELS, buckets, description, field)


def _gauge(name: str, metric: str, unit: str, labels: tuple[str, ...], description: str) -> SLI:
    return SLI(name, metric, "gauge", unit, labels, (), description, None)


def _counter(name: str, metric: str, unit: str, field: str | None, description: str) -> SLI:
    return SLI(name, metric, "counter", unit, _ENGINE_LABELS, (), description, field)


_SLIS: tuple[SLI, ...] = (
    _histogram(
        "ttft", "llm_slo_time_to_first_token_seconds", "ttft_s",
        "Time to first token: request start to the first output token's bytes sent.",
        OTEL_TTFT_BUCKETS,
    ),
    _histogram(
        "tpot", "llm_slo_time_per_output_token_seconds", "tpot_s",
        "Time per output token after the first: (e2e - ttft) / (output_tokens - 1).",
        OTEL_TPOT_BUCKETS,
    ),
    _histogram(
        "itl", "llm_slo_inter_token_latency_seconds", "itl_s",
        "Inter-token latency: every gap between consecutive output-token chunks.",
        OTEL_TPOT_BUCKETS,
    ),
    _histogram(
        "e2e", "llm_slo_request_duration_seconds", "e2e_s",
        "End-to-end latency: request start to the last byte sent.",
        OTEL_DURATION_BUCKETS,
    ),
    _histogram("queue", "llm_slo_queue_time_seconds", "queue_s",
               "Waiting for a batch slot, preemptions included.", PHASE_BUCKETS),
    _histogram("prefill", "llm_slo_prefill_time_seconds", "prefill_s",
               "Prompt processing up to the first token.", PHASE_BUCKETS),
    _histogram("queue_prefill", "llm_slo_queue_prefill_time_seconds", "queue_prefill_s",
               "Queue and prefill, not split: the engine's time before the first token when "
               "it does not report the two apart (any engine seen only through the wire).",
               PHASE_BUCKETS),
    _histogram("decode", "llm_slo_decode_time_seconds", "decode_s",
               "First token to last token, detokenization excluded.", PHASE_BUCKETS),
    _histogram("detokenize", "llm_slo_detokenize_time_seconds", "detokenize_s",
               "Turning token ids into text.", PHASE_BUCKETS),
    _histogram("network", "llm_slo_network_time_seconds", "network_s",
               "Receiving the request body and sending the rest after the last token.",
               PHASE_BUCKETS),
    _histogram("other", "llm_slo_other_time_seconds", "other_s",
               "Parsing, tokenizing and validation: the rest of e2e.", PHASE_BUCKETS),
    SLI("input_tokens", "llm_slo_request_input_tokens", "histogram", "tokens", _REQUEST_LABELS,
        OTEL_TOKEN_BUCKETS, "Prompt tokens per request.", "input_tokens"),
    SLI("output_tokens", "llm_slo_request_output_tokens", "histogram", "tokens", _REQUEST_LABELS,
        OTEL_TOKEN_BUCKETS, "Output tokens per request.", "output_tokens"),
    SLI("requests", "llm_slo_requests_total", "counter", "requests", (*_REQUEST_LABELS, "outcome"),
        (), "Finished requests by outcome; availability = ok / (all - client_error - cancelled).",
        "outcome"),
    SLI("throughput", "llm_slo_output_tokens_total", "counter", "tokens", _REQUEST_LABELS, (),
        "Output tokens generated; its rate is the output throughput.", "output_tokens"),
    SLI("cold_start", "llm_slo_cold_start_seconds", "histogram", "seconds", _ENGINE_LABELS,
        COLD_START_BUCKETS, "Process start to ready: model load and warm-up.", None),
    _gauge("queue_depth", "llm_slo_queue_depth", "requests", ("tier", "model"),
           "Requests waiting for a batch slot, per tier."),
    # Computed at scrape time from queue_depth, requests and prefill (slo.headroom).
    _gauge("ttft_headroom", "llm_slo_ttft_headroom_ratio", "ratio", ("tier",),
           "Predicted TTFT of a request arriving now (waiting ahead / drain rate + prefill) "
           "over the tier's TTFT objective: 1 is at the objective; scale out below it."),
    _gauge("running", "llm_slo_running_requests", "requests", _ENGINE_LABELS,
           "Requests in the running batch."),
    _gauge("batch_size", "llm_slo_batch_size", "requests", _ENGINE_LABELS,
           "Sequences in the last scheduler step."),
    _gauge("kv_usage", "llm_slo_kv_cache_usage_ratio", "ratio", _ENGINE_LABELS,
           "Fraction of KV-cache blocks in use."),
    _gauge("gpu_utilization", "llm_slo_gpu_utilization_ratio", "ratio", ("model", "gpu"),
           "GPU compute utilization."),
    _gauge("gpu_memory", "llm_slo_gpu_memory_used_bytes", "bytes", ("model", "gpu"),
           "GPU memory in use."),
    _counter("prefix_cache_queries", "llm_slo_prefix_cache_queries_total", "tokens", "input_tokens",
             "Prompt tokens looked up in the prefix cache."),
    _counter("prefix_cache_hits", "llm_slo_prefix_cache_hits_total", "tokens", "cached_tokens",
             "Prompt tokens served from the prefix cache."),
    _counter("spec_decode_draft_tokens", "llm_slo_spec_decode_draft_tokens_total", "tokens", None,
             "Tokens proposed by the speculative-decoding draft."),
    _counter("spec_decode_accepted_tokens", "llm_slo_spec_decode_accepted_tokens_total", "tokens",
             None, "Draft tokens accepted by the target model."),
    # Tier isolation in the engine's scheduler (fed by its per-step stats).
    SLI("preemptions", "llm_slo_preemptions_total", "counter", "requests", _TIER_ENGINE_LABELS,
        (), "Running sequences preempted (recompute) by a higher tier or a full KV cache.", None),
    SLI("scheduler_queue_wait", "llm_slo_scheduler_queue_wait_seconds", "histogram", "seconds",
        _TIER_ENGINE_LABELS, PHASE_BUCKETS,
        "Each wait for a batch slot, from joining the queue (arrival or preemption) to being "
        "scheduled.", None),
    SLI("prefill_chunks", "llm_slo_prefill_chunks_per_step", "histogram", "chunks",
        _ENGINE_LABELS, CHUNK_BUCKETS,
        "Prefill chunks per scheduler step (a long prompt spans several steps).", None),
    SLI("shed", "llm_slo_shed_requests_total", "counter", "requests",
        (*_TIER_ENGINE_LABELS, "reason"), (),
        "Requests the engine refused with a 429, by reason: " + ", ".join(SHED_REASONS) + ".",
        None),
    # Losses of the observability layer itself: expected to stay 0 (alert when they move).
    _counter("records_dropped", "llm_slo_records_dropped_total", "records", None,
             "Request records lost: neither the record store nor its spool file took them."),
    _counter("records_spooled", "llm_slo_records_spooled_total", "records", None,
             "Request records written to the local spool while the record store was out."),
    _counter("spans_dropped", "llm_slo_spans_dropped_total", "spans", None,
             "Spans dropped because the exporter's queue was full."),
    # Engine request spans taken at POST /v1/traces (middleware.intake).
    _counter("engine_spans_joined", "llm_slo_engine_spans_joined_total", "spans", None,
             "Engine request spans joined to their request's record."),
    _counter("engine_spans_unmatched", "llm_slo_engine_spans_unmatched_total", "spans", None,
             "Engine request spans dropped: no request of ours came for them in time."),
    _counter("engine_spans_duplicate", "llm_slo_engine_spans_duplicate_total", "spans", None,
             "Engine request spans dropped: their request already had one."),
    _counter("engine_span_exports_rejected", "llm_slo_engine_span_exports_rejected_total",
             "exports", None, "Trace exports refused (400, 413): not OTLP, malformed, too big."),
    _counter("engine_span_waits_expired", "llm_slo_engine_span_waits_expired_total",
             "records", None,
             "Requests recorded without their engine span after waiting for it (it never came)."),
)  # fmt: skip

CATALOG: dict[str, SLI] = {sli.name: sli for sli in _SLIS}
LATENCY_SLIS: tuple[str, ...] = tuple(sli.name for sli in _SLIS if sli.is_latency)
# What the middleware, the live windows, the records and the dashboards derive their lists
# from (never re-typed there). A latency SLI's record field is also the attribute of the
# middleware's Breakdown (middleware/breakdown.py) that measures it.
LATENCY_FIELDS: dict[str, str] = {
    sli.name: sli.record_field for sli in _SLIS if sli.is_latency and sli.record_field
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
