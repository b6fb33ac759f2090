"""An engine's own Prometheus `/metrics`, read into the engine gauges the bundled engine fills.

`slo proxy --upstream-metrics` scrapes the engine behind it (vLLM, SGLang, TGI, llama-server)
so that the dashboards' engine rows and the "Engine now" panel of `/slo.html` show that engine.
The text is parsed by prometheus_client's own parser; which engine it is follows from the
families present (each adapter's `metrics` map in the registry, the one with most families
present wins), and each mapped family feeds one target of `ENGINE_METRIC_TARGETS`:

- several label sets of one family (vLLM's `engine` index under data parallelism, SGLang's
  ranks) are separate engines' numbers: counts are summed, the KV-cache ratio takes the
  fullest (the one that preempts first, as the dashboards' `max by (instance)` does);
- several families of one engine for one target (a current name and an older one): the first
  present, in the adapter's order;
- running and batch size stand in for each other when an engine reports one only: under
  continuous batching every running request is in each step's batch;
- preemptions are a counter: what it grew since the last scrape is added (the first scrape is
  the baseline; a series that went down restarted and counts from 0; a new one counts whole).

Scraping runs on its own thread, not on the event loop: fetching and parsing a vLLM
exposition (hundreds of histogram lines) is CPU work that would otherwise sit between
streamed chunks of every request in flight; a thread only takes the GIL in slices, and the
proxy's lifecycle (`slo.cli.proxy`) starts and stops it without a hook in the middleware.
"""

from __future__ import annotations

import logging
import math
import ssl
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

import middleware.upstream  # noqa: F401  (registers every engine's adapter)
from middleware.upstream.registry import ADAPTERS, ENGINE_METRIC_TARGETS, EngineAdapter

logger = logging.getLogger(__name__)

GAUGE_TARGETS = tuple(name for name in ENGINE_METRIC_TARGETS if name != "preemptions")
DEFAULT_INTERVAL_S = 5.0
# One series of a counter: its labels, sorted.
SeriesKey = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class EngineReading:
    """What one scrape said: the engine, its gauges by `GAUGE_TARGETS` name (only those it
    reports), and the preemption counter's total per series (empty when it has none)."""

    engine: str
    gauges: dict[str, float]
    preemptions: dict[SeriesKey, float] = field(default_factory=dict)


def read_metrics(
    text: str, adapters: Iterable[EngineAdapter] | None = None
) -> EngineReading | None:
    """The engine reading in a Prometheus text exposition; None when no adapter's families are
    in it. Raises ValueError when the text is not Prometheus text."""
    candidates = [a for a in (adapters or ADAPTERS.values()) if a.metrics]
    wanted = {name for adapter in candidates for name in adapter.metrics}
    families: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        # Without a TYPE line a counter keeps its `_total` in the family name.
        name = family.name
        if name not in wanted and name.endswith("_total"):
            name = name[: -len("_total")]
        if name in wanted:
            own = {family.name, family.name + "_total"}  # not `_created`, `_bucket`, ...
            samples = [(s.name, s.labels, s.value) for s in family.samples if s.name in own]
            families.setdefault(name, []).extend(samples)
    if not families:
        return None
    adapter = max(candidates, key=lambda a: sum(name in families for name in a.metrics))
    gauges: dict[str, float] = {}
    preemptions: dict[SeriesKey, float] = {}
    for name, target in adapter.metrics.items():
        if name not in families or target in gauges or (target == "preemptions" and preemptions):
            continue
        values = [(labels, v) for _, labels, v in families[name] if math.isfinite(v)]
        if not values:
            continue
        if target == "preemptions":
            preemptions = {tuple(sorted(labels.items())): v for labels, v in values}
        elif target == "kv_usage":
            gauges[target] = max(v for _, v in values)
        else:
            gauges[target] = sum(v for _, v in values)
    for one, other in (("running", "batch_size"), ("batch_size", "running")):
        if one not in gauges and other in gauges:
            gauges[one] = gauges[other]
    return EngineReading(adapter.name, gauges, preemptions)


class PreemptionDeltas:
    """How much a counter grew between scrapes, series by series (labels as keys)."""

    def __init__(self) -> None:
        self._last: dict[SeriesKey, float] | None = None

    def grew(self, totals: Mapping[SeriesKey, float]) -> float:
        """Increments since the previous call; 0 on the first (the baseline)."""
        last, self._last = self._last, dict(totals)
        if last is None:
            return 0.0
        grown = 0.0
        for key, total in totals.items():
            before = last.get(key)
            # A new series counts whole; one that went down restarted from 0.
            grown += total if before is None or total < before else total - before
        return grown


def metrics_url(choice: str, upstream_url: str) -> str | None:
    """`--upstream-metrics`: None for off, `<upstream>/metrics` for auto, else the URL given."""
    if choice == "off":
        return None
    if choice == "auto":
        return upstream_url.rstrip("/") + "/metrics"
    parts = urlsplit(choice)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"{choice!r} is not off, auto or an http(s) URL; give the engine's metrics "
            "endpoint, e.g. http://127.0.0.1:8080/metrics"
        )
    return choice


class EngineMetricsScraper:
    """Reads `url` every `interval_s` on a daemon thread and hands each reading to `apply`
    (`MetricSet.set_engine_gauges(gauges, preempted)`); `None` gauges mean "no longer known".

    Failures never raise: the first of a run is logged once (with the reason and the fix),
    the recovery once more; gauges it had set are cleared while the engine does not answer.
    """

    def __init__(
        self,
        url: str,
        apply: Callable[[Mapping[str, float], float], None],
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        """`verify`: how an https:// engine's certificate is checked (the TLS context `slo
        proxy` reaches the upstream with; True: the system's CAs)."""
        if interval_s <= 0:
            raise ValueError(f"scrape interval must be positive seconds, got {interval_s}")
        self.url = url
        self.verify = verify
        self.interval_s = interval_s
        self.timeout_s = max(1.0, min(interval_s, 5.0))
        self._apply = apply
        self._deltas = PreemptionDeltas()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing: str | None = None  # the reason logged for the current run of failures
        self._engine: str | None = None
        self._applied = False  # gauges set from a reading, to clear when it stops answering

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name="llm-slo-engine-metrics", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop and wait for the thread (at most one fetch's timeout)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 1.0)

    def _run(self) -> None:
        headers = {"accept": "text/plain; version=0.0.4"}  # not OpenMetrics
        with httpx.Client(timeout=self.timeout_s, headers=headers, verify=self.verify) as client:
            while not self._stop.is_set():
                self.scrape_once(client)
                self._stop.wait(self.interval_s)

    def scrape_once(self, client: httpx.Client) -> None:
        try:
            response = client.get(self.url)
        except httpx.HTTPError as error:
            self.failed(f"cannot reach it ({type(error).__name__}: {error})")
            return
        if response.status_code != 200:
            self.failed(f"it answers HTTP {response.status_code}")
            return
        self.take(response.text)

    def take(self, text: str) -> None:
        """Parse one exposition and apply it; a bad or unknown one is a logged failure."""
        try:
            reading = read_metrics(text)
        except Exception as error:  # the parser raises ValueError, odd input anything
            self.failed(f"its answer is not Prometheus text ({type(error).__name__}: {error})")
            return
        if reading is None:
            engines = ", ".join(sorted(a.name for a in ADAPTERS.values() if a.metrics))
            self.failed(f"it has no metric family of a known engine ({engines})")
            return
        if self._failing is not None or self._engine != reading.engine:
            logger.info(
                "llm-slo: engine metrics from %s: %s (queue depth, running, batch size, KV "
                "cache and preemptions from its own gauges)",
                self.url,
                reading.engine,
            )
        self._failing, self._engine = None, reading.engine
        self._apply(reading.gauges, self._deltas.grew(reading.preemptions))
        self._applied = True

    def failed(self, reason: str) -> None:
        if self._failing is None:
            logger.warning(
                "llm-slo: no engine metrics from %s: %s; the engine gauges stay empty, trying "
                "again every %g s (point --upstream-metrics at the engine's metrics URL, or "
                "--upstream-metrics off to stop)",
                self.url,
                reason,
                self.interval_s,
            )
        self._failing = reason
        if self._applied:
            self._apply({}, 0.0)
            self._applied = False


def mapping_table(adapters: Iterable[EngineAdapter] | None = None) -> str:
    """The table in docs/proxy.md of which family feeds which engine gauge, per engine
    (Markdown)."""
    columns = {
        "queue_depth": "queue depth",
        "running": "running",
        "batch_size": "batch size",
        "kv_usage": "KV cache",
        "preemptions": "preemptions",
    }
    assert set(columns) == set(ENGINE_METRIC_TARGETS), "a target without a column"
    rows = [
        "| engine | " + " | ".join(columns.values()) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]
    for adapter in sorted((a for a in (adapters or ADAPTERS.values()) if a.metrics), key=_name):
        cells = []
        for target in columns:
            names = [f"`{name}`" for name, to in adapter.metrics.items() if to == target]
            cells.append(" or ".join(names) or "–")
        for one, other in (("running", "batch_size"), ("batch_size", "running")):
            index = list(columns).index(one)
            if cells[index] == "–" and other in adapter.metrics.values():
                cells[index] = f"= {columns[other]}"
        rows.append(f"| {adapter.name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _name(adapter: EngineAdapter) -> str:
    return adapter.name
