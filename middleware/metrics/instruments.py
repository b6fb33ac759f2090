"""prometheus_client instruments made from the SLI catalog's entries: name, description and
label names come from `slo.sli.CATALOG`, so nothing here spells a metric."""

from __future__ import annotations

from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from slo.sli import CATALOG


def counter(registry: CollectorRegistry, name: str) -> Counter:
    """The catalog's counter `name` (prometheus_client adds the `_total` suffix itself)."""
    sli = CATALOG[name]
    metric = sli.metric[: -len("_total")] if sli.metric.endswith("_total") else sli.metric
    return Counter(metric, sli.description, labelnames=sli.labels, registry=registry)


def histogram(registry: CollectorRegistry, name: str, buckets: tuple[float, ...]) -> Histogram:
    sli = CATALOG[name]
    return Histogram(
        sli.metric, sli.description, labelnames=sli.labels, buckets=buckets, registry=registry
    )


# How `/metrics` combines the workers' values of a gauge (the modes this house uses).
GaugeMode = Literal["livesum", "max", "livemostrecent"]


def gauge(registry: CollectorRegistry, name: str, multiprocess_mode: GaugeMode) -> Gauge:
    sli = CATALOG[name]
    return Gauge(
        sli.metric,
        sli.description,
        labelnames=sli.labels,
        registry=registry,
        multiprocess_mode=multiprocess_mode,
    )


def label_values(name: str, tier: str, model: str) -> tuple[str, ...]:
    """The catalog metric `name`'s label values, in its label order (tier only if it has one)."""
    values = {"tier": tier, "model": model}
    return tuple(values[label] for label in CATALOG[name].labels)
