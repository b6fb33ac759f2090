"""The engine's SLIs, a part of the catalog (`slo.sli` holds the whole): its cold start, its
queue, batch, KV cache and GPUs, the serving techniques it reports on (prefix caching,
speculative decoding) and tier isolation in its scheduler. The bundled engine feeds them from
its hooks; any other engine from its own metrics (`middleware.upstream`)."""

from __future__ import annotations

from slo.buckets import CHUNK_BUCKETS, COLD_START_BUCKETS, PHASE_BUCKETS
from slo.indicator import ENGINE_LABELS, SLI, TIER_ENGINE_LABELS, counter, gauge

# Why the engine's scheduler shed a request (a 429, outcome "shed"): its tier's TTFT objective
# was out of reach (the slo policy), or the waiting queue was full.
SHED_REASONS: tuple[str, ...] = ("ttft_out_of_reach", "queue_full")
# What made a request wait, in the bundled engine's exact blame (docs/blame.md): the requests
# scheduled ahead of it, the prefill chunks beside its decode steps, and being preempted.
# engine.blame.BLAME_CAUSES restates them; tests/unit/engine/test_blame.py compares the two.
DELAY_CAUSES: tuple[str, ...] = ("queue", "interference", "preemption")
# The culprit tier of queue time when the engine ran nothing (it was idle until the request).
NO_CULPRIT = "none"

ENGINE_SLIS: tuple[SLI, ...] = (
    SLI(
        "cold_start",
        "llm_slo_cold_start_seconds",
        "histogram",
        "seconds",
        ENGINE_LABELS,
        COLD_START_BUCKETS,
        "Process start to ready: model load and warm-up.",
        None,
    ),
    gauge(
        "queue_depth",
        "llm_slo_queue_depth",
        "requests",
        ("tier", "model"),
        "Requests waiting for a batch slot, per tier.",
    ),
    # Computed at scrape time from queue_depth, requests and prefill (slo.headroom).
    gauge(
        "ttft_headroom",
        "llm_slo_ttft_headroom_ratio",
        "ratio",
        ("tier",),
        "Predicted TTFT of a request arriving now (waiting ahead / drain rate + prefill) "
        "over the tier's TTFT objective: 1 is at the objective; scale out below it.",
    ),
    gauge(
        "running",
        "llm_slo_running_requests",
        "requests",
        ENGINE_LABELS,
        "Requests in the running batch.",
    ),
    gauge(
        "batch_size",
        "llm_slo_batch_size",
        "requests",
        ENGINE_LABELS,
        "Sequences in the last scheduler step.",
    ),
    gauge(
        "kv_usage",
        "llm_slo_kv_cache_usage_ratio",
        "ratio",
        ENGINE_LABELS,
        "Fraction of KV-cache blocks in use.",
    ),
    gauge(
        "gpu_utilization",
        "llm_slo_gpu_utilization_ratio",
        "ratio",
        ("model", "gpu"),
        "GPU compute utilization.",
    ),
    gauge(
        "gpu_memory",
        "llm_slo_gpu_memory_used_bytes",
        "bytes",
        ("model", "gpu"),
        "GPU memory in use.",
    ),
    counter(
        "gpu_telemetry_errors",
        "llm_slo_gpu_telemetry_errors_total",
        "calls",
        None,
        "NVML calls that failed while reading the GPUs (nvmlInit included, once: a machine "
        "without the driver); a GPU whose read failed is left out of the GPU gauges.",
    ),
    counter(
        "prefix_cache_queries",
        "llm_slo_prefix_cache_queries_total",
        "tokens",
        "input_tokens",
        "Prompt tokens looked up in the prefix cache.",
    ),
    counter(
        "prefix_cache_hits",
        "llm_slo_prefix_cache_hits_total",
        "tokens",
        "cached_tokens",
        "Prompt tokens served from the prefix cache.",
    ),
    counter(
        "spec_decode_draft_tokens",
        "llm_slo_spec_decode_draft_tokens_total",
        "tokens",
        None,
        "Tokens proposed by the speculative-decoding draft.",
    ),
    counter(
        "spec_decode_accepted_tokens",
        "llm_slo_spec_decode_accepted_tokens_total",
        "tokens",
        None,
        "Draft tokens accepted by the target model.",
    ),
    # Tier isolation in the engine's scheduler (fed by its per-step stats).
    SLI(
        "preemptions",
        "llm_slo_preemptions_total",
        "counter",
        "requests",
        TIER_ENGINE_LABELS,
        (),
        "Running sequences preempted (recompute) by a higher tier or a full KV cache.",
        None,
    ),
    SLI(
        "scheduler_queue_wait",
        "llm_slo_scheduler_queue_wait_seconds",
        "histogram",
        "seconds",
        TIER_ENGINE_LABELS,
        PHASE_BUCKETS,
        "Each wait for a batch slot, from joining the queue (arrival or preemption) to being "
        "scheduled.",
        None,
    ),
    SLI(
        "prefill_chunks",
        "llm_slo_prefill_chunks_per_step",
        "histogram",
        "chunks",
        ENGINE_LABELS,
        CHUNK_BUCKETS,
        "Prefill chunks per scheduler step (a long prompt spans several steps).",
        None,
    ),
    SLI(
        "shed",
        "llm_slo_shed_requests_total",
        "counter",
        "requests",
        (*TIER_ENGINE_LABELS, "reason"),
        (),
        "Requests the engine refused with a 429, by reason: " + ", ".join(SHED_REASONS) + ".",
        None,
    ),
    SLI(
        "delay_caused",
        "llm_slo_delay_caused_seconds_total",
        "counter",
        "seconds",
        (*TIER_ENGINE_LABELS, "culprit_tier", "cause", "estimated"),
        (),
        "Seconds of a tier's requests' waits caused by a tier's requests, by cause: "
        + ", ".join(DELAY_CAUSES)
        + f"; culprit_tier '{NO_CULPRIT}' is queue time nobody caused; estimated 'false': the "
        "bundled engine's exact blame, 'true': estimated in front of any engine.",
        None,
    ),
)
