"""A server's /metrics as samples: every one keyed by name and labels, and a metric's total over
its label sets."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]  # (name, labels) -> value


def metric_values(base_url: str) -> Samples:
    return samples_of(httpx.get(base_url + "/metrics", timeout=10).text)


def samples_of(text: str) -> Samples:
    """Prometheus' text format as samples."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(values: Samples, name: str) -> float:
    return sum(value for (sample, _labels), value in values.items() if sample == name)
