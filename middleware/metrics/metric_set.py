"""Prometheus metrics, every name, unit, label and bucket taken from the SLI catalog.

Every label child (tier x route x outcome x model for the request counter, tier x route x model
for the histograms, the token counter and the good-requests counter) is created at startup, so
every series is exported at 0 before the first request: Prometheus' `increase()`/`rate()` then
count a series' first requests too (a series born with its first requests already counted hides
them from every rule, panel and `slo check --prometheus`). In multiprocess mode a created child
is written to the worker's file at 0 at once, so the aggregated `/metrics` has them from the
first scrape.

Label children are bound once per (tier, route) and outcome. In one process the request
histograms are our own (`middleware.metrics.prom_export.OwnHistogram`: plain-list bucket counts fed
under one lock per request, read by the registry through prometheus_client's public collector
API), and the request counters wait in plain counts until the registry is read, or at most
FLUSH_EVERY_S. OpenMetrics output carries exemplars with trace ids. With
`PROMETHEUS_MULTIPROC_DIR` set (multi-worker servers), values go through prometheus_client's
histograms and multiprocess files (`observe` per value), flushed after every request, and
`/metrics` aggregates every worker.

The engine's series (its gauges, step counters, scheduler tier isolation, GPUs) are
`middleware.metrics.engine_series.EngineSeries`, which a MetricSet owns and registers with its own.
The per-tier SLO-headroom gauge (`middleware.metrics.headroom`) is computed from those series at
scrape time; with several workers, from every worker's sum.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_TYPE
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

import middleware.hotpath as hotpath
from middleware.metrics.engine_series import EngineSeries
from middleware.metrics.headroom import HeadroomCollector
from middleware.metrics.histograms import BucketCounts, FlushOnCollect, bucket_counts
from middleware.metrics.instruments import counter, histogram
from middleware.metrics.prom_export import OwnHistogram
from middleware.request.goodput import GoodRequests
from middleware.request.timeline import Breakdown
from slo.sli import (
    CATALOG,
    LATENCY_FIELDS,
    OUTCOMES,
    PER_REQUEST_LATENCY_SLIS,
    buckets_for,
)
from slo.spec import SLOSpec

if TYPE_CHECKING:
    from middleware.request.measured import MeasuredRequest

# Longest a request's observations wait before reaching the metrics while requests come in.
# A scrape always sees them: reading the registry (or `/metrics`) flushes first.
FLUSH_EVERY_S = 1.0

# Per-request latency histograms, from the catalog; each is fed by its record field of
# Breakdown (the middleware's live windows check at import that it carries every one).
REQUEST_HISTOGRAMS = PER_REQUEST_LATENCY_SLIS
# The Breakdown values of REQUEST_HISTOGRAMS, in that order, in one call.
_latencies = attrgetter(*(LATENCY_FIELDS[name] for name in REQUEST_HISTOGRAMS))
# Histograms that carry the trace id as an exemplar (OpenMetrics), when there is one.
EXEMPLAR_HISTOGRAMS = ("ttft", "e2e")
# Counters of the middleware's own losses, read from the store and the span processor.
LOSS_COUNTERS = ("records_dropped", "records_spooled", "spans_dropped")
# The span join's counters (middleware.intake.JoinCounts field per catalog name).
INTAKE_COUNTERS = {
    "engine_spans_joined": "joined",
    "engine_spans_unmatched": "unmatched",
    "engine_spans_duplicate": "duplicates",
    "engine_span_exports_rejected": "rejected",
    "engine_span_waits_expired": "waited_in_vain",
}


# The histograms fed one value per request, in the order `MetricSet.observe` reads them.
PER_REQUEST = (*REQUEST_HISTOGRAMS, "input_tokens", "output_tokens")


class _Bound:
    """One (tier, route)'s label children, bound once, and its pending output tokens and good
    requests.

    `plan` has per PER_REQUEST histogram: (child, takes an exemplar); `itl` is the gaps'
    histogram child. In a single process the children are `HistogramSeries` (plain lists, fed
    under the MetricSet's lock); with PROMETHEUS_MULTIPROC_DIR, prometheus_client children.
    """

    __slots__ = (
        "good",
        "good_requests_total",
        "itl",
        "output_tokens",
        "output_tokens_total",
        "plan",
    )

    def __init__(
        self, histograms: dict[str, Any], output_tokens_total: Any, good_requests_total: Any
    ) -> None:
        self.plan = [(histograms[name], name in EXEMPLAR_HISTOGRAMS) for name in PER_REQUEST]
        self.itl = histograms["itl"]
        self.output_tokens_total = output_tokens_total
        self.output_tokens = 0  # pending for the counter
        self.good_requests_total = good_requests_total
        self.good = 0  # pending for the counter


class MetricSet:
    """The catalog's metrics in one registry, for one model."""

    def __init__(
        self,
        spec: SLOSpec,
        model: str,
        registry: CollectorRegistry | None = None,
        routes: Iterable[str] = (),
    ) -> None:
        """`routes`: the route labels requests can carry (the middleware's LLM routes); every
        child of every tier on them is created now, at 0."""
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        # First in the registry: whoever collects it gets the pending counts too.
        self.registry.register(FlushOnCollect(self))
        self.model = model
        self.spec = spec
        # Pending observations (see `observe`): one lock per request instead of two per value.
        self._lock = threading.Lock()
        self.histograms = {
            name: self._request_histogram(name, buckets_for(name, spec))
            for name in (*PER_REQUEST, "itl")
        }
        self.requests = counter(self.registry, "requests")
        # Requests that met every latency objective of their tier: goodput's good events.
        self.good_requests = counter(self.registry, "good_requests")
        self.goodput = GoodRequests(spec)
        self.output_tokens_total = counter(self.registry, "throughput")
        self.cold_start = histogram(
            self.registry, "cold_start", CATALOG["cold_start"].default_buckets
        )
        self.engine = EngineSeries(self.registry, spec, model, self.multiprocess)
        self.gauges = self.engine.gauges  # the live page reads the engine's state from them
        # The SLO-headroom gauge, computed from the series above whenever the registry is
        # read. With several workers, `/metrics` serves it from the registry that sums their
        # files (`_aggregate`); the one here then sees this worker alone (in-process readers).
        self.registry.register(HeadroomCollector(spec, self.registry))
        self._aggregated: CollectorRegistry | None = None
        self.losses: dict[str, Any] = {}
        for name in (*LOSS_COUNTERS, *INTAKE_COUNTERS):
            self.losses[name] = counter(self.registry, name).labels(model=model)
            self.losses[name].inc(0)  # exported as 0 from the start: alerts need the series
        self._losses_seen = dict.fromkeys((*LOSS_COUNTERS, *INTAKE_COUNTERS), 0)
        self._bounds = {name: buckets_for(name, spec) for name in (*PER_REQUEST, "itl")}
        self._children: dict[tuple[str, str], _Bound] = {}
        self._outcomes: dict[tuple[str, str, str], Any] = {}
        self._requests_pending: dict[tuple[str, str, str], int] = {}
        # Other workers read a worker's values from its files: multiprocess mode flushes at once.
        self._flush_every_s = 0.0 if self.multiprocess else FLUSH_EVERY_S
        self._flush_at = 0.0
        for tier in spec.tiers:
            for route in sorted(set(routes)):
                self._bound(tier.name, route)
                for outcome in OUTCOMES:
                    self._outcome(tier.name, route, outcome)

    def _bound(self, tier: str, route: str) -> _Bound:
        key = (tier, route)
        bound = self._children.get(key)
        if bound is None:
            labels = {"tier": tier, "model": self.model, "route": route}
            bound = self._children[key] = _Bound(
                {name: metric.labels(**labels) for name, metric in self.histograms.items()},
                self.output_tokens_total.labels(**labels),
                self.good_requests.labels(**labels),
            )
        return bound

    def _request_histogram(self, name: str, bounds: tuple[float, ...]) -> Any:
        """The catalog histogram `name`: our own (`middleware.metrics.prom_export`) in one process,
        prometheus_client's where its multiprocess files must add the workers up."""
        if self.multiprocess:
            return histogram(self.registry, name, bounds)
        sli = CATALOG[name]
        return OwnHistogram(
            self.registry, sli.metric, sli.description, sli.labels, bounds, lock=self._lock
        )

    def _outcome(self, tier: str, route: str, outcome: str) -> Any:
        key = (tier, route, outcome)
        child = self._outcomes.get(key)
        if child is None:
            child = self._outcomes[key] = self.requests.labels(
                tier=tier, model=self.model, route=route, outcome=outcome
            )
        return child

    @property
    def itl_bounds(self) -> tuple[float, ...]:
        """The ITL histogram's bucket boundaries (the live windows bucket on the same)."""
        return self._bounds["itl"]

    def observe(
        self,
        request: MeasuredRequest,
        breakdown: Breakdown | None,
        trace_id: str | None,
        itl_counts: BucketCounts | None = None,
        good: bool | None = None,
    ) -> None:
        """Count one settled request; with an ok breakdown, observe its latencies and token
        counts; a good request (goodput) also in the good-requests counter.

        The counts wait in plain lists and reach the metrics at the next flush: whenever the
        registry is read, and at most FLUSH_EVERY_S later. `itl_counts` are the breakdown's
        gaps already counted on `itl_bounds` (`bucket_counts`), when the caller has them.
        `good`: the reporter's decision (`middleware.request.goodput`, which the live windows
        are given too); by default decided here from `breakdown`.
        """
        tier, route = request.tier, request.route
        key = (tier, route, request.outcome)
        if key not in self._outcomes:  # a label set not created at startup
            self._outcome(*key)
        if good is None:
            good = self.goodput.good(tier, request.outcome, breakdown)
        bound = None if breakdown is None and not good else self._bound(tier, route)
        with self._lock:
            pending = self._requests_pending
            pending[key] = pending.get(key, 0) + 1
            if bound is not None:
                bound.good += good
                if breakdown is not None:
                    self._add(bound, breakdown, request.input_tokens, trace_id, itl_counts)
            now = time.monotonic()
            if now < self._flush_at:
                return
            self._flush_at = now + self._flush_every_s
            self._flush_locked()

    def _add(
        self,
        bound: _Bound,
        breakdown: Breakdown,
        input_tokens: int,
        trace_id: str | None,
        itl_counts: BucketCounts | None,
    ) -> None:
        output_tokens = breakdown.output_tokens
        values = (*_latencies(breakdown), input_tokens, output_tokens)
        if self.multiprocess:  # prometheus_client's children (no exemplars across workers)
            for value, (child, _) in zip(values, bound.plan, strict=True):
                if value is not None:
                    child.observe(value)
        else:  # our HistogramSeries, in one hot-path call: this runs for every request
            hotpath.observe_values(bound.plan, values, trace_id)
        gaps = breakdown.itl_s
        if gaps:
            itl = bound.itl
            if self.multiprocess:  # prometheus_client's child: one value at a time
                for gap in gaps:
                    itl.observe(gap)
            else:
                counts = itl.counts
                for index, count in itl_counts or bucket_counts(itl.bounds, gaps):
                    counts[index] += count
                itl.sum += sum(gaps)
        bound.output_tokens += output_tokens

    def flush(self) -> None:
        """Add every pending observation to the metrics (before anything reads them)."""
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        requests, self._requests_pending = self._requests_pending, {}
        for key, count in requests.items():
            self._outcomes[key].inc(count)
        for bound in list(self._children.values()):  # a request may add one meanwhile
            if bound.output_tokens:
                bound.output_tokens_total.inc(bound.output_tokens)
                bound.output_tokens = 0
            if bound.good:
                bound.good_requests_total.inc(bound.good)
                bound.good = 0

    def observe_engine_step(self, stats: Any) -> None:
        """Engine gauges from the bundled engine's `on_step(StepStats)` (`EngineSeries`)."""
        self.engine.observe_step(stats)

    def set_engine_gauges(self, values: Mapping[str, float], preempted: float = 0.0) -> None:
        """Engine gauges from another engine's own numbers, engine-wide, in the default tier
        (`EngineSeries.set_engine_wide`); `preempted`: preemptions since the last call."""
        self.engine.set_engine_wide(values, preempted)

    def observe_gpus(self, reading: Any) -> None:
        """The GPU gauges and NVML's failed calls from a reading (`EngineSeries`)."""
        self.engine.observe_gpus(reading)

    def observe_losses(self, store: Any | None, span_drops: Any, join_counts: Any = None) -> None:
        """Bring the loss counters up to the running totals of the record store, the span
        processor and the engine-span join (`dropped`, `spooled`; `DropCounter.dropped`;
        `JoinCounts`).

        Called at scrape time: the totals live where the losses happen (other threads), and
        adding only the difference keeps these real counters, summed across workers.
        """
        totals = {
            "records_dropped": store.dropped if store is not None else 0,
            "records_spooled": store.spooled if store is not None else 0,
            "spans_dropped": span_drops.dropped,
        }
        if join_counts is not None:
            for name, field in INTAKE_COUNTERS.items():
                totals[name] = getattr(join_counts, field)
        for name, total in totals.items():
            delta = total - self._losses_seen[name]
            if delta > 0:
                self.losses[name].inc(delta)
                self._losses_seen[name] = total

    def exposition(self, accept: str) -> tuple[bytes, str]:
        registry = self.registry
        self.flush()
        if self.multiprocess:
            registry = self._aggregate()
        if "application/openmetrics-text" in accept:
            return generate_openmetrics(registry), OPENMETRICS_TYPE
        return generate_latest(registry), CONTENT_TYPE_LATEST

    def _aggregate(self) -> CollectorRegistry:
        """Every worker's series summed (prometheus_client's multiprocess files), and the
        headroom gauge computed over those sums. Kept from scrape to scrape: the gauge's drain
        rate needs the previous scrapes this worker served."""
        if self._aggregated is None:
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            registry.register(HeadroomCollector(self.spec, registry))
            self._aggregated = registry
        return self._aggregated
