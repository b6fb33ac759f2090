"""Series and expectations for promtool tests, from traffic with a known answer: a counter
from per-step increments, one tier's availability counters, good-requests counter and latency
histogram, the alerts Prometheus must show, and which burn-rate rules fire on raw windows
(`firing`; the generated burn-rate tests use `alerts.burn_model`, which knows the recorded
tiles).

Exact counts: Prometheus 2.x selects ranges closed on both ends and every series starts at 0 at
t=0 with a sample every `sample_s`, so `increase()` over a window that is a multiple of the
sample interval, evaluated on a sample, is the exact count (no extrapolation). `window_counts`
is that same sum, for the model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from alerts.rules import Links, shown_annotations
from slo.alert_rules import AlertRule
from slo.arithmetic import burn_rule_fires
from slo.promql import le_value
from slo.sli import CATALOG
from slo.spec import SLOSpec

REQUESTS = CATALOG["requests"].metric
GOOD_REQUESTS = CATALOG["good_requests"].metric
_MODEL = "test-model"
_ROUTE = "/v1/completions"


@dataclass(frozen=True)
class Traffic:
    """Good and bad events per sample step of one tier's objective; step k covers (k-1, k]."""

    good: tuple[int, ...]
    bad: tuple[int, ...]

    def window_counts(self, step: int, window_steps: int) -> tuple[int, int]:
        """(bad, events) in the window ending at sample `step`, as increase() sees them."""
        start = max(0, step - window_steps)
        bad = sum(self.bad[start:step])
        return bad, bad + sum(self.good[start:step])


def counter_values(increments: Sequence[int]) -> str:
    """promtool's expanding notation for a counter from 0: runs of equal increments compress."""
    parts = ["0"]
    value, index = 0, 0
    while index < len(increments):
        run = 1
        while index + run < len(increments) and increments[index + run] == increments[index]:
            run += 1
        step = increments[index]
        first = value + step
        parts.append(f"{first}+{step}x{run - 1}" if run > 1 else str(first))
        value += step * run
        index += run
    return " ".join(parts)


def availability_series(tier: str, traffic: Traffic) -> list[dict[str, str]]:
    def series(outcome: str, increments: Sequence[int]) -> dict[str, str]:
        labels = f'{{tier="{tier}", model="{_MODEL}", route="{_ROUTE}", outcome="{outcome}"}}'
        return {"series": REQUESTS + labels, "values": counter_values(increments)}

    return [series("ok", traffic.good), series("server_error", traffic.bad)]


def good_requests_series(tier: str, increments: Sequence[int]) -> dict[str, str]:
    """One tier's good-requests counter (goodput's good events) from per-step increments."""
    labels = f'{{tier="{tier}", model="{_MODEL}", route="{_ROUTE}"}}'
    return {"series": GOOD_REQUESTS + labels, "values": counter_values(increments)}


def histogram_series(
    metric: str, tier: str, bounds: Sequence[float], values: Sequence[Sequence[float]]
) -> list[dict[str, str]]:
    """One tier's latency histogram as the middleware exports it, from the values observed in
    each sample step: `_bucket` per bound (cumulative, `le` as prometheus_client writes it,
    +Inf last) and `_count`. `_sum` is left out: no generated rule reads it."""
    labels = f'tier="{tier}", model="{_MODEL}", route="{_ROUTE}"'
    edges = [*(le_value(bound) for bound in bounds), "+Inf"]
    limits = [*bounds, math.inf]
    series = [
        {
            "series": f'{metric}_bucket{{{labels}, le="{edge}"}}',
            "values": counter_values([sum(v <= limit for v in step) for step in values]),
        }
        for edge, limit in zip(edges, limits, strict=True)
    ]
    series.append(
        {
            "series": f"{metric}_count{{{labels}}}",
            "values": counter_values([len(s) for s in values]),
        }
    )
    return series


def expected_alerts(
    rules: Sequence[AlertRule], spec: SLOSpec, links: Links
) -> list[dict[str, Any]]:
    """promtool's `exp_alerts` for `rules` firing: their labels and annotations as shown."""
    return [
        {
            "exp_labels": rule.labels_with_phase(),
            "exp_annotations": shown_annotations(rule, spec, links),
        }
        for rule in rules
    ]


def firing(
    rules: Sequence[AlertRule], traffic: Traffic, step: int, sample_s: float
) -> list[AlertRule]:
    """The burn-rate rules among `rules` that fire at sample `step` (the model)."""
    fired = []
    for rule in rules:
        assert rule.objective is not None and rule.factor is not None
        windows = [
            traffic.window_counts(step, round(window / sample_s)) for window in rule.windows_s
        ]
        if burn_rule_fires(windows, rule.objective.target, rule.factor, rule.min_events):
            fired.append(rule)
    return fired
