"""Prometheus metrics, every name, unit, label and bucket taken from the SLI catalog.

Label children are bound once per (tier, route) and outcome; `observe` is then a few dict
lookups and calls. OpenMetrics output carries exemplars with trace ids. With
`PROMETHEUS_MULTIPROC_DIR` set (multi-worker servers), values go through prometheus_client's
multiprocess files and `/metrics` aggregates every worker.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_TYPE
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from middleware.timeline import Breakdown
from slo.sli import CATALOG, buckets_for
from slo.spec import SLOSpec

# Per-request histograms and the record field (of Breakdown) that feeds each.
REQUEST_HISTOGRAMS = (
    "ttft",
    "tpot",
    "e2e",
    "queue",
    "prefill",
    "decode",
    "detokenize",
    "network",
    "other",
)
ENGINE_GAUGES = ("queue_depth", "running", "batch_size", "kv_usage")
# Catalog counter -> the StepStats field that feeds it.
ENGINE_COUNTERS = {
    "prefix_cache_queries": "prefix_cache_queried_tokens",
    "prefix_cache_hits": "prefix_cache_hit_tokens",
    "spec_decode_draft_tokens": "spec_draft_tokens",
    "spec_decode_accepted_tokens": "spec_accepted_tokens",
}
# Counters of the middleware's own losses, read from the store and the span processor.
LOSS_COUNTERS = ("records_dropped", "records_spooled", "spans_dropped")
GPU_GAUGES = ("gpu_utilization", "gpu_memory")


def _base_name(metric: str, kind: str) -> str:
    # prometheus_client appends `_total` to counters itself.
    return metric[: -len("_total")] if kind == "counter" and metric.endswith("_total") else metric


def observe_one(child: Any, bounds: tuple[float, ...], value: float) -> None:
    """`child.observe(value)` without the per-call checks and the linear bucket scan."""
    buckets = getattr(child, "_buckets", None)
    if buckets is None or len(buckets) != len(bounds) + 1:
        child.observe(value)
        return
    buckets[bisect.bisect_left(bounds, value)].inc(1)
    child._sum.inc(value)


def observe_many(child: Any, bounds: tuple[float, ...], values: Iterable[float]) -> None:
    """Observe many values on one histogram child with one increment per touched bucket.

    A 500-token stream has 499 inter-token gaps; observing them one by one costs a lock and
    several calls each. Uses prometheus_client's bucket values when present (stable since
    0.4), else falls back to `observe`.
    """
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if buckets is None or total is None or len(buckets) != len(bounds) + 1:
        for value in values:
            child.observe(value)
        return
    counts: dict[int, int] = {}
    summed = 0.0
    for value in values:
        index = bisect.bisect_left(bounds, value)
        counts[index] = counts.get(index, 0) + 1
        summed += value
    for index, count in counts.items():
        buckets[index].inc(count)
    total.inc(summed)


class MetricSet:
    """The catalog's metrics in one registry, for one model."""

    def __init__(
        self, spec: SLOSpec, model: str, registry: CollectorRegistry | None = None
    ) -> None:
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.model = model
        self.spec = spec
        self._tier_by_priority = {tier.priority: tier.name for tier in spec.tiers}
        self.histograms = {
            name: self._histogram(name, buckets_for(name, spec))
            for name in (*REQUEST_HISTOGRAMS, "itl", "input_tokens", "output_tokens")
        }
        self.requests = self._counter("requests")
        self.output_tokens_total = self._counter("throughput")
        self.cold_start = self._histogram("cold_start", CATALOG["cold_start"].default_buckets)
        self.gauges: dict[str, Gauge] = {}
        for name in (*ENGINE_GAUGES, *GPU_GAUGES):
            sli = CATALOG[name]
            self.gauges[name] = Gauge(
                sli.metric,
                sli.description,
                labelnames=sli.labels,
                registry=self.registry,
                multiprocess_mode="livesum" if name == "queue_depth" else "max",
            )
        # Engine counters, fed from each step's stats (prefix cache and speculative decoding).
        self.engine_counters = {
            name: self._counter(name).labels(model=model) for name in ENGINE_COUNTERS
        }
        self.losses: dict[str, Any] = {}
        for name in LOSS_COUNTERS:
            self.losses[name] = self._counter(name).labels(model=model)
            self.losses[name].inc(0)  # exported as 0 from the start: alerts need the series
        self._losses_seen = dict.fromkeys(LOSS_COUNTERS, 0)
        self._itl_bounds = buckets_for("itl", spec)
        self._bounds = {name: buckets_for(name, spec) for name in REQUEST_HISTOGRAMS}
        self._children: dict[tuple[str, str], dict[str, Any]] = {}
        self._outcomes: dict[tuple[str, str, str], Any] = {}
        self._queue_depth = {
            tier.name: self.gauges["queue_depth"].labels(tier=tier.name, model=model)
            for tier in spec.tiers
        }

    def _counter(self, name: str) -> Counter:
        """The catalog's counter `name` (prometheus_client adds the `_total` suffix itself)."""
        sli = CATALOG[name]
        return Counter(
            _base_name(sli.metric, "counter"),
            sli.description,
            labelnames=sli.labels,
            registry=self.registry,
        )

    def _histogram(self, name: str, buckets: tuple[float, ...]) -> Histogram:
        sli = CATALOG[name]
        return Histogram(
            sli.metric,
            sli.description,
            labelnames=sli.labels,
            buckets=buckets,
            registry=self.registry,
        )

    def _bound(self, tier: str, route: str) -> dict[str, Any]:
        key = (tier, route)
        children = self._children.get(key)
        if children is None:
            labels = {"tier": tier, "model": self.model, "route": route}
            children = {
                name: histogram.labels(**labels) for name, histogram in self.histograms.items()
            }
            children["output_tokens_total"] = self.output_tokens_total.labels(**labels)
            self._children[key] = children
        return children

    def observe(
        self,
        tier: str,
        route: str,
        outcome: str,
        breakdown: Breakdown | None,
        input_tokens: int,
        trace_id: str | None,
    ) -> None:
        key = (tier, route, outcome)
        counter = self._outcomes.get(key)
        if counter is None:
            counter = self._outcomes[key] = self.requests.labels(
                tier=tier, model=self.model, route=route, outcome=outcome
            )
        counter.inc()
        if breakdown is None:
            return
        children = self._bound(tier, route)
        exemplar = {"trace_id": trace_id} if trace_id and not self.multiprocess else None
        values = {
            "e2e": breakdown.e2e_s,
            "ttft": breakdown.ttft_s,
            "tpot": breakdown.tpot_s,
            "queue": breakdown.queue_s,
            "prefill": breakdown.prefill_s,
            "decode": breakdown.decode_s,
            "detokenize": breakdown.detokenize_s,
            "network": breakdown.network_s,
            "other": breakdown.other_s,
        }
        bounds = self._bounds
        for name, value in values.items():
            if value is None:
                continue
            if exemplar is not None and name in ("e2e", "ttft"):
                children[name].observe(value, exemplar)
            else:
                observe_one(children[name], bounds[name], value)
        if breakdown.itl_s:
            observe_many(children["itl"], self._itl_bounds, breakdown.itl_s)
        children["input_tokens"].observe(input_tokens)
        children["output_tokens"].observe(breakdown.output_tokens)
        if breakdown.output_tokens:
            children["output_tokens_total"].inc(breakdown.output_tokens)

    def observe_engine_step(self, stats: Any) -> None:
        """Engine gauges from the bundled engine's `on_step(StepStats)`."""
        model = self.model
        self.gauges["running"].labels(model=model).set(stats.num_running)
        self.gauges["batch_size"].labels(model=model).set(stats.batch_size)
        self.gauges["kv_usage"].labels(model=model).set(stats.kv_usage)
        waiting = dict.fromkeys(self._queue_depth, 0)
        for priority, count in stats.waiting_by_priority.items():
            tier = self._tier_by_priority.get(priority)
            if tier is not None:
                waiting[tier] += count
        for tier, child in self._queue_depth.items():
            child.set(waiting[tier])
        for name, field in ENGINE_COUNTERS.items():
            amount = getattr(stats, field, 0)
            if amount:
                self.engine_counters[name].inc(amount)

    def observe_gpus(self, gpus: Iterable[Any]) -> None:
        for gpu in gpus:
            index = str(gpu.index)
            self.gauges["gpu_utilization"].labels(model=self.model, gpu=index).set(
                gpu.utilization_percent / 100
            )
            self.gauges["gpu_memory"].labels(model=self.model, gpu=index).set(gpu.memory_used_bytes)

    def observe_losses(self, store: Any | None, span_drops: Any) -> None:
        """Bring the loss counters up to the running totals of the record store and the span
        processor (`dropped`, `spooled`; `DropCounter.dropped`).

        Called at scrape time: the totals live where the losses happen (other threads), and
        adding only the difference keeps these real counters, summed across workers.
        """
        totals = {
            "records_dropped": store.dropped if store is not None else 0,
            "records_spooled": store.spooled if store is not None else 0,
            "spans_dropped": span_drops.dropped,
        }
        for name, total in totals.items():
            delta = total - self._losses_seen[name]
            if delta > 0:
                self.losses[name].inc(delta)
                self._losses_seen[name] = total

    def exposition(self, accept: str) -> tuple[bytes, str]:
        registry = self.registry
        if self.multiprocess:
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
        if "application/openmetrics-text" in accept:
            return generate_openmetrics(registry), OPENMETRICS_TYPE
        return generate_latest(registry), CONTENT_TYPE_LATEST
