"""The engine's series: gauges of its state (queue, running, batch, KV cache), counters of its
steps (prefix cache, speculative decoding), its scheduler's tier isolation (preemptions, queue
waits, sheds per tier, prefill chunks per step, the delays each tier caused each tier) and the
GPUs' gauges, with the NVML calls that failed reading them.

Fed by the bundled engine's steps (`observe_step`) and its requests' blame (`observe_blame`),
by another engine's own `/metrics` (`set_engine_wide`, from `slo proxy --upstream-metrics`) and
by GPU readings (`observe_gpus`).
Every per-tier child is made at construction, at 0, keyed by the tier's priority (what the
engine reports). `middleware.metrics.metric_set.MetricSet` owns one, in its registry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from middleware.metrics.instruments import counter, gauge, histogram, label_values
from slo.engine_slis import DELAY_CAUSES, NO_CULPRIT
from slo.sli import CATALOG, SHED_REASONS
from slo.spec import SLOSpec, Tier

ENGINE_GAUGES = ("queue_depth", "running", "batch_size", "kv_usage")
# Catalog counter -> the StepStats field that feeds it.
ENGINE_COUNTERS = {
    "prefix_cache_queries": "prefix_cache_queried_tokens",
    "prefix_cache_hits": "prefix_cache_hit_tokens",
    "spec_decode_draft_tokens": "spec_draft_tokens",
    "spec_decode_accepted_tokens": "spec_accepted_tokens",
}
GPU_GAUGES = ("gpu_utilization", "gpu_memory")


class EngineSeries:
    """The engine's and GPUs' metrics for one model, registered in `registry`."""

    def __init__(
        self, registry: CollectorRegistry, spec: SLOSpec, model: str, multiprocess: bool
    ) -> None:
        """`multiprocess`: values go through prometheus_client's multiprocess files, where a
        removed child cannot be removed from the other workers' files."""
        self.spec = spec
        self.model = model
        self._multiprocess = multiprocess
        self._tier_by_priority = {tier.priority: tier.name for tier in spec.tiers}
        self.gauges: dict[str, Gauge] = {
            # A queue's depth adds up across workers; the other gauges are the engine's own.
            name: gauge(registry, name, "livesum" if name == "queue_depth" else "max")
            for name in ENGINE_GAUGES
        }
        for name in GPU_GAUGES:  # each worker reads the GPUs at its own scrapes: the last wins
            self.gauges[name] = gauge(registry, name, "livemostrecent")
        # Engine counters, fed from each step's stats (prefix cache and speculative decoding).
        self.engine_counters = {
            name: counter(registry, name).labels(model=model) for name in ENGINE_COUNTERS
        }
        self._bind_scheduler_metrics(registry)
        # NVML's failed calls, born at 0, brought up to the telemetry's running total.
        self.gpu_errors = counter(registry, "gpu_telemetry_errors").labels(model=model)
        self._gpu_errors_seen = 0
        self._gpus_exported: set[str] = set()
        self._engine_wide = False  # engine gauges come from an engine that knows no tiers
        self._queue_depth = {
            tier.name: self.gauges["queue_depth"].labels(tier=tier.name, model=model)
            for tier in spec.tiers
        }

    def _bind_scheduler_metrics(self, registry: CollectorRegistry) -> None:
        """Tier isolation: preemptions, queue waits and sheds per tier, chunks per step. Every
        child is made now, at 0, keyed by the tier's priority (what the engine reports)."""
        model = self.model
        preemptions = self._preemption_counter = counter(registry, "preemptions")
        queue_wait = histogram(
            registry, "scheduler_queue_wait", CATALOG["scheduler_queue_wait"].default_buckets
        )
        shed = counter(registry, "shed")
        self.prefill_chunks = histogram(
            registry, "prefill_chunks", CATALOG["prefill_chunks"].default_buckets
        ).labels(model=model)
        self._preemptions: dict[int, Any] = {}
        self._queue_wait: dict[int, Any] = {}
        self._shed: dict[tuple[int, str], Any] = {}
        for tier in self.spec.tiers:
            self._preemptions[tier.priority] = preemptions.labels(tier=tier.name, model=model)
            self._preemptions[tier.priority].inc(0)
            self._queue_wait[tier.priority] = queue_wait.labels(tier=tier.name, model=model)
            for reason in SHED_REASONS:
                child = shed.labels(tier=tier.name, model=model, reason=reason)
                child.inc(0)
                self._shed[(tier.priority, reason)] = child
        self._bind_delay_caused(registry)

    def _bind_delay_caused(self, registry: CollectorRegistry) -> None:
        """Seconds each tier's requests waited because of each tier's, by cause: a child per
        (tier, culprit tier, cause), born at 0, keyed by priorities (what the engine reports;
        None: queue time when the engine ran nothing, culprit tier NO_CULPRIT). The exact
        children (`estimated="false"`) are born now, the estimated ones by `bear_estimated`."""
        self._caused = counter(registry, "delay_caused")
        self._delay_caused: dict[tuple[int, int | None, str], Any] = {}
        for tier, culprit, cause, child in self._delay_children("false"):
            culprit_priority = None if culprit is None else culprit.priority
            self._delay_caused[(tier.priority, culprit_priority, cause)] = child
        self._estimated_caused: dict[tuple[str, str, str], Any] = {}

    def _delay_children(self, estimated: str) -> Iterator[tuple[Tier, Tier | None, str, Any]]:
        """(tier, culprit tier or None for nobody, cause, its child at 0) for every pair."""
        tiers = self.spec.tiers
        for tier in tiers:
            for cause in DELAY_CAUSES:
                nobody: list[Tier | None] = [None] if cause == "queue" else []
                for culprit in [*tiers, *nobody]:
                    name = NO_CULPRIT if culprit is None else culprit.name
                    child = self._caused.labels(
                        tier=tier.name,
                        model=self.model,
                        culprit_tier=name,
                        cause=cause,
                        estimated=estimated,
                    )
                    child.inc(0)
                    yield tier, culprit, cause, child

    def bear_estimated(self) -> None:
        """The estimated blame's children (`estimated="true"`, docs/blame.md), born at 0: for
        a middleware that estimates blame (`slo proxy` in front of any engine)."""
        for tier, culprit, cause, child in self._delay_children("true"):
            name = NO_CULPRIT if culprit is None else culprit.name
            self._estimated_caused[(tier.name, name, cause)] = child

    def observe_blame(self, blame: Any) -> None:
        """The delays one request's blame names (`engine.blame.RequestBlame`: its priority,
        and seconds by cause and culprit priority); priorities no tier has are not counted."""
        children = self._delay_caused
        for cause, culprit, seconds, _ in blame.by_tier:
            child = children.get((blame.priority, culprit, cause))
            if child is not None:
                child.inc(seconds)

    def observe_estimated(self, tier: str, blame: dict[str, Any]) -> None:
        """The delays one request's estimated blame names (its record's `delay_blame`)."""
        children = self._estimated_caused
        for entry in blame["by_tier"]:
            child = children.get((tier, entry["tier"], entry["cause"]))
            if child is not None:
                child.inc(entry["s"])

    def observe_step(self, stats: Any) -> None:
        """Engine gauges, counters and tier isolation from the bundled engine's
        `on_step(StepStats)`."""
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
        self._observe_scheduler(stats)

    def _observe_scheduler(self, stats: Any) -> None:
        """Tier-isolation metrics from a step; engines whose StepStats predate them report
        nothing here (getattr defaults). Priorities no tier has are not counted."""
        chunks = getattr(stats, "prefill_chunks", 0)  # observed for steps that did work
        if chunks or getattr(stats, "prefill_tokens", 0) or getattr(stats, "decode_tokens", 0):
            self.prefill_chunks.observe(chunks)
        for priority, count in getattr(stats, "preempted_by_priority", {}).items():
            child = self._preemptions.get(priority)
            if child is not None:
                child.inc(count)
        for priority, wait_s in getattr(stats, "queue_waits", ()):
            child = self._queue_wait.get(priority)
            if child is not None:
                child.observe(wait_s)
        for priority, reason in getattr(stats, "shed", ()):
            child = self._shed.get((priority, reason))
            if child is not None:
                child.inc()

    @property
    def engine_wide(self) -> bool:
        """The gauges come from another engine's own numbers (no tiers, no scheduler of ours:
        nothing it shed is known)."""
        return self._engine_wide

    def set_engine_wide(self, values: Mapping[str, float], preempted: float = 0.0) -> None:
        """Engine gauges from another engine's own numbers (`slo proxy` reading its /metrics),
        by ENGINE_GAUGES name; a name missing from `values` is not exported (unknown, not 0).
        `preempted`: preemptions since the last call.

        Such an engine knows nothing of the spec's tiers, so its queue depth and preemptions
        are engine-wide: they go to the spec's default tier (where requests no rule matches
        fall), and the other tiers' queue and preemption series are no longer exported (a 0
        there would say those tiers wait for nothing)."""
        default, model = self.spec.default_tier, self.model
        if not self._engine_wide and not self._multiprocess:  # no removal across processes
            for tier in self.spec.tiers:
                if tier is not default:
                    self.gauges["queue_depth"].remove(
                        *label_values("queue_depth", tier.name, model)
                    )
                    self._preemption_counter.remove(*label_values("preemptions", tier.name, model))
        self._engine_wide = True
        for name in ENGINE_GAUGES:
            labels = label_values(name, default.name, model)
            value = values.get(name)
            if value is not None:
                self.gauges[name].labels(*labels).set(value)
            else:
                with contextlib.suppress(KeyError):  # older prometheus_client raise when absent
                    self.gauges[name].remove(*labels)
        if preempted > 0:
            self._preemptions[default.priority].inc(preempted)

    def observe_gpus(self, reading: Any) -> None:
        """Each GPU's utilization (0-1) and memory in use, labelled by its index, from a
        reading (`engine.gpu.GpuReading`: `devices` and `errors`; a plain iterable of devices
        is a reading without errors). A GPU the reading left out (its NVML call failed) is no
        longer exported, unknown rather than stale; NVML's failed calls are brought up to the
        reading's running total."""
        devices = getattr(reading, "devices", reading)
        read: set[str] = set()
        for gpu in devices:
            index = str(gpu.index)
            read.add(index)
            self.gauges["gpu_utilization"].labels(model=self.model, gpu=index).set(
                gpu.utilization_percent / 100
            )
            self.gauges["gpu_memory"].labels(model=self.model, gpu=index).set(gpu.memory_used_bytes)
        if not self._multiprocess:  # no removal across processes
            for index in self._gpus_exported - read:
                for name in GPU_GAUGES:
                    with contextlib.suppress(KeyError):
                        self.gauges[name].remove(self.model, index)
        self._gpus_exported = read
        errors = int(getattr(reading, "errors", 0))
        if errors > self._gpu_errors_seen:
            self.gpu_errors.inc(errors - self._gpu_errors_seen)
            self._gpu_errors_seen = errors
