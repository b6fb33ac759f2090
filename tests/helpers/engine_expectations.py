"""What the engine's panels and the GenAI row must show at `QUERY_AT` for the known traffic
(`tests.helpers.dashboard_traffic`): from the engine's steps, the GPUs as the stand-in NVML
last reported them, the cold start, and the records with the model each request named.

`ENGINE` maps each panel title to a function of the traffic giving its expected series, one
per target (`tests.helpers.panel_expectations` has the service's rows).
"""

from __future__ import annotations

from collections.abc import Callable

from dashboards.queries import QUANTILES
from engine.hooks import StepStats
from middleware.otel.request import operation_for_route
from slo import genai
from slo.records import RequestRecord
from slo.sli import CATALOG, SHED_REASONS, buckets_for
from tests.helpers.dashboard_traffic import COLD_START_S, INSTANCE, MODEL, QUERY_AT, Known
from tests.helpers.panel_checks import Exact, Labels, Quantile, Series, labels
from tests.helpers.panel_expectations import RATE_S, Expectation, rate_window

_ON_INSTANCE = labels(instance=INSTANCE)


def _steps(known: Known) -> list[StepStats]:
    return known.steps_in(QUERY_AT - RATE_S, QUERY_AT)


def _last(known: Known) -> StepStats:
    return known.steps_in(0, QUERY_AT)[-1]


def _tiers(known: Known) -> dict[int, str]:
    return {tier.priority: tier.name for tier in known.spec.tiers}


def queue_depth(known: Known) -> list[Series]:
    waiting = _last(known).waiting_by_priority
    return [{labels(tier=name): Exact(waiting.get(p, 0)) for p, name in _tiers(known).items()}]


def queue_wait(known: Known) -> list[Series]:
    """The middleware's queue phase per request (ok requests of each tier)."""
    groups: dict[Labels, list[float]] = {}
    for record in rate_window(known).ok:
        if record.queue_s is not None:
            groups.setdefault(labels(tier=record.tier), []).append(record.queue_s)
    bounds = buckets_for("queue", known.spec)
    return [
        {key: Quantile(float(q), tuple(values), bounds) for key, values in groups.items()}
        for q in ("0.5", "0.95")
    ]


def batch_and_running(known: Known) -> list[Series]:
    last = _last(known)
    return [{_ON_INSTANCE: Exact(last.batch_size)}, {_ON_INSTANCE: Exact(last.num_running)}]


def kv_usage(known: Known) -> list[Series]:
    return [{_ON_INSTANCE: Exact(_last(known).kv_usage)}]


def cold_starts(known: Known) -> list[Series]:
    """The engine came up once, before the first scrape: no start in the rate window."""
    return [{_ON_INSTANCE: Exact(COLD_START_S)}, {_ON_INSTANCE: Exact(0.0)}]


def preemptions(known: Known) -> list[Series]:
    counts = dict.fromkeys(_tiers(known).values(), 0)
    for stats in _steps(known):
        for priority, count in stats.preempted_by_priority.items():
            counts[_tiers(known)[priority]] += count
    return [{labels(tier=tier): Exact(n / RATE_S) for tier, n in counts.items()}]


def scheduler_queue_wait(known: Known) -> list[Series]:
    waits: dict[Labels, list[float]] = {}
    for stats in _steps(known):
        for priority, wait_s in stats.queue_waits:
            waits.setdefault(labels(tier=_tiers(known)[priority]), []).append(wait_s)
    bounds = CATALOG["scheduler_queue_wait"].default_buckets
    return [
        {key: Quantile(float(q), tuple(values), bounds) for key, values in waits.items()}
        for q in ("0.5", "0.95")
    ]


def shed(known: Known) -> list[Series]:
    counts = {(tier, reason): 0 for tier in _tiers(known).values() for reason in SHED_REASONS}
    for stats in _steps(known):
        for priority, reason in stats.shed:
            counts[(_tiers(known)[priority], reason)] += 1
    return [{labels(tier=t, reason=r): Exact(n / RATE_S) for (t, r), n in counts.items()}]


def prefill_chunks(known: Known) -> list[Series]:
    chunks = tuple(float(stats.prefill_chunks) for stats in _steps(known))
    bounds = CATALOG["prefill_chunks"].default_buckets
    return [
        {labels(): Exact(sum(chunks) / len(chunks))},
        {labels(): Quantile(0.95, chunks, bounds)},
    ]


def _per_gpu(value: Callable[[int], float], known: Known) -> list[Series]:
    return [
        {
            labels(instance=INSTANCE, gpu=str(index)): Exact(value(index))
            for index in range(len(known.gpus))
        }
    ]


def gpu_memory(known: Known) -> list[Series]:
    return _per_gpu(lambda index: known.gpus[index].memory_used_bytes, known)


def gpu_utilization(known: Known) -> list[Series]:
    return _per_gpu(lambda index: known.gpus[index].utilization_percent / 100, known)


def _step_ratio(numerator: str, denominator: str) -> Expectation:
    def expected(known: Known) -> list[Series]:
        steps = _steps(known)
        total = sum(getattr(stats, denominator) for stats in steps)
        return [{labels(): Exact(sum(getattr(stats, numerator) for stats in steps) / total)}]

    return expected


def _genai_groups(known: Known, ok_only: bool) -> dict[Labels, list[RequestRecord]]:
    """The rate window's records by the row's groups: operation and the model the request
    named (none: the label is empty, so absent)."""
    operation, model = (
        genai.prometheus_label(key) for key in (genai.OPERATION, genai.REQUEST_MODEL)
    )
    window = rate_window(known)
    groups: dict[Labels, list[RequestRecord]] = {}
    for record in window.ok if ok_only else window.records:
        pairs = {operation: operation_for_route(record.route)}
        if record.request_id not in known.unnamed:
            pairs[model] = MODEL
        groups.setdefault(frozenset(pairs.items()), []).append(record)
    return groups


# The row's instruments and the record field each measures.
_GENAI_FIELDS = {
    genai.TIME_TO_FIRST_TOKEN.name: "ttft_s",
    genai.REQUEST_DURATION.name: "e2e_s",
    genai.TIME_PER_OUTPUT_TOKEN.name: "tpot_s",
}


def genai_percentiles(instrument: genai.Instrument) -> Expectation:
    field = _GENAI_FIELDS[instrument.name]

    def expected(known: Known) -> list[Series]:
        groups = _genai_groups(known, ok_only=instrument.records == "ok")
        values = {
            key: tuple(getattr(r, field) for r in records if getattr(r, field) is not None)
            for key, records in groups.items()
        }
        return [
            {key: Quantile(float(q), found, instrument.boundaries) for key, found in values.items()}
            for q in QUANTILES
        ]

    return expected


def token_usage(known: Known) -> list[Series]:
    groups = _genai_groups(known, ok_only=False)
    return [
        {
            key: Exact(sum(getattr(r, field) for r in records) / RATE_S)
            for key, records in groups.items()
        }
        for field in ("input_tokens", "output_tokens")
    ]


ENGINE: dict[str, Expectation] = {
    "Queue depth per tier": queue_depth,
    "Queue wait time": queue_wait,
    "Batch size and running requests per instance": batch_and_running,
    "KV-cache usage per instance": kv_usage,
    "Cold starts": cold_starts,
    "Preemptions per tier": preemptions,
    "Scheduler queue wait per tier": scheduler_queue_wait,
    "Shed requests per tier and reason": shed,
    "Prefill chunks per step": prefill_chunks,
    "GPU memory per instance": gpu_memory,
    "GPU utilization per instance": gpu_utilization,
    "Prefix-cache hit rate": _step_ratio("prefix_cache_hit_tokens", "prefix_cache_queried_tokens"),
    "Speculative-decoding acceptance": _step_ratio("spec_accepted_tokens", "spec_draft_tokens"),
    "Time to first token by operation and model": genai_percentiles(genai.TIME_TO_FIRST_TOKEN),
    "Request duration by operation and model": genai_percentiles(genai.REQUEST_DURATION),
    "Time per output token by operation and model": genai_percentiles(genai.TIME_PER_OUTPUT_TOKEN),
    "Token usage rate by operation and model": token_usage,
}
