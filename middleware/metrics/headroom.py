"""`llm_slo_ttft_headroom_ratio{tier}`: the per-tier SLO-headroom gauge (see `slo.headroom`
for its definition), as a Prometheus collector computed at scrape time.

It reads the llm_slo_* series already in the registry (queue depth per tier, finished
requests, prefill time), so it needs no hook into the request path: the bundled engine fills
those series through its hooks, `slo proxy` from the engine's /metrics, and the gauge is the
same in both. `middleware.metrics.metric_set.MetricSet` registers it next to the middleware's
metrics (with several workers, on the registry that sums their files, so it reads every worker):

    registry.register(HeadroomCollector(spec, registry))

Rates need two scrapes: the first reads the drain rate as unknown (its floor, so a queue
then reads as late, never as fine).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from slo.headroom import WINDOW_S, TierSignal, headroom_ratio, signals
from slo.sli import CATALOG
from slo.spec import SLOSpec


class HeadroomCollector(Collector):
    def __init__(
        self,
        spec: SLOSpec,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._signals: list[TierSignal] = signals(spec)
        self._registry = registry
        self._clock = clock
        # (time, finished requests, {tier: (prefill sum, prefill count)}) per scrape, in window
        self._history: deque[tuple[float, float, dict[str, tuple[float, float]]]] = deque()
        self._lock = threading.Lock()  # scrapes may come on several threads at once
        self._inside = threading.local()  # this thread is reading the registry for us

    def describe(self) -> list[GaugeMetricFamily]:
        return [self._family()]  # no registry read at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if getattr(self._inside, "reading", False):  # reading the registry collects us too
            return
        self._inside.reading = True
        try:
            family = self._measure()
        finally:
            self._inside.reading = False
        yield family

    def _family(self) -> GaugeMetricFamily:
        sli = CATALOG["ttft_headroom"]
        return GaugeMetricFamily(sli.metric, sli.description, labels=list(sli.labels))

    def _measure(self) -> GaugeMetricFamily:
        waiting, finished, prefill = self._read()
        with self._lock:
            now = self._clock()
            self._history.append((now, finished, prefill))
            while len(self._history) > 2 and now - self._history[1][0] >= WINDOW_S:
                self._history.popleft()
            first_at, first_finished, first_prefill = self._history[0]
        span = now - first_at
        drain = (finished - first_finished) / span if span > 0 else 0.0
        family = self._family()
        for signal in self._signals:
            total, count = prefill.get(signal.tier, (0.0, 0.0))
            old_total, old_count = first_prefill.get(signal.tier, (0.0, 0.0))
            if count > old_count:
                mean_prefill = (total - old_total) / (count - old_count)
            else:
                mean_prefill = total / count if count else 0.0
            ahead = sum(waiting.get(name, 0.0) for name in signal.ahead)
            ratio = headroom_ratio(ahead, drain, mean_prefill, signal.threshold_s)
            family.add_metric([signal.tier], ratio)
        return family

    def _read(self) -> tuple[dict[str, float], float, dict[str, tuple[float, float]]]:
        """Waiting per tier, finished requests (every tier), prefill sum and count per tier."""
        queue = CATALOG["queue_depth"].metric
        requests = CATALOG["requests"].metric
        prefill = CATALOG["prefill"].metric
        waiting: dict[str, float] = {}
        finished = 0.0
        sums: dict[str, list[float]] = {}
        for metric in self._registry.collect():
            for sample in metric.samples:
                tier = sample.labels.get("tier", "")
                if sample.name == queue:
                    waiting[tier] = waiting.get(tier, 0.0) + sample.value
                elif sample.name == requests:
                    finished += sample.value
                elif sample.name in (f"{prefill}_sum", f"{prefill}_count"):
                    pair = sums.setdefault(tier, [0.0, 0.0])
                    pair[0 if sample.name.endswith("_sum") else 1] += sample.value
        return waiting, finished, {tier: (pair[0], pair[1]) for tier, pair in sums.items()}
