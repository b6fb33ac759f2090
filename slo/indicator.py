"""What one SLI is: the record every entry of the catalog (`slo.sli`, `slo.engine_slis`) is,
the label sets its entries share, and a constructor for each common shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["histogram", "counter", "gauge"]

STANDARD_LABELS: tuple[str, ...] = ("tier", "model", "route")
REQUEST_LABELS = STANDARD_LABELS
ENGINE_LABELS: tuple[str, ...] = ("model",)
TIER_ENGINE_LABELS: tuple[str, ...] = ("tier", "model")


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


def histogram(
    name: str, metric: str, field: str | None, description: str, buckets: tuple[float, ...]
) -> SLI:
    """A request latency: seconds, one observation per request, labelled as requests are."""
    return SLI(name, metric, "histogram", "seconds", REQUEST_LABELS, buckets, description, field)


def gauge(name: str, metric: str, unit: str, labels: tuple[str, ...], description: str) -> SLI:
    return SLI(name, metric, "gauge", unit, labels, (), description, None)


def counter(name: str, metric: str, unit: str, field: str | None, description: str) -> SLI:
    """A count the engine or the middleware keeps per model."""
    return SLI(name, metric, "counter", unit, ENGINE_LABELS, (), description, field)
