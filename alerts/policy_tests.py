"""promtool tests that tell the burn-rate policies apart, from traffic with a known answer.

For every burn-rate rule of the policy (page 14.4x 1h/5m, 6x 6h/30m, ticket 3x 1d/2h, 1x
3d/6h by default) one test group feeds one tier's availability series:

    good traffic ... | burn at just above the rule's factor for its long window | good again
    0                P                                                           T

The burn ratio lies above the rule's factor and at or below the next higher factor, so every
rule with a higher factor stays silent; the good history before P dilutes the rules with longer
windows. At T the expected alerts are exactly those `slo.arithmetic.burn_rule_fires` finds on
the same counts (the rule itself always, others only where their windows allow it), and at the
first evaluation after T + its short window the rule has resolved.

Exact counts: Prometheus 2.x selects ranges closed on both ends and every series starts at 0 at
t=0 with a sample every `sample_s`, so `increase()` over a window that is a multiple of the
sample interval, evaluated on a sample, is the exact count (no extrapolation). `window_counts`
is that same sum, for the model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from slo.alert_rules import AVAILABILITY, AlertRule
from slo.arithmetic import burn_limit, burn_rule_fires
from slo.promql import le_value
from slo.sli import CATALOG

REQUESTS = CATALOG["requests"].metric
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


@dataclass(frozen=True)
class PolicyCase:
    rule: AlertRule
    traffic: Traffic
    checks: tuple[tuple[int, list[AlertRule]], ...]  # (sample step, rules expected firing)


def policy_cases(
    rules: Sequence[AlertRule], sample_s: float, evaluation_s: float
) -> list[PolicyCase]:
    """One case per burn-rate rule of the first tier with an availability objective."""
    burn = [r for r in rules if r.kind == "burn_rate" and r.sli == AVAILABILITY]
    if not burn:
        return []
    tier = burn[0].tier
    burn = [r for r in burn if r.tier == tier]
    every = round(evaluation_s / sample_s)
    cases = []
    for rule in burn:
        assert rule.objective is not None and rule.factor is not None
        higher = [r.factor for r in burn if r.factor is not None and r.factor > rule.factor]
        per_step, bad = _burn_mix(rule, min(higher, default=None))
        longer = [
            r.long_window_s or 0.0
            for r in burn
            if (r.long_window_s or 0) > (rule.long_window_s or 0)
        ]
        burn_steps = round((rule.long_window_s or 0.0) / sample_s)
        history = round(min(longer, default=rule.long_window_s or 0.0) / sample_s) - burn_steps
        history = max(history, 0)
        recovery = every * math.ceil(round((rule.short_window_s or 0.0) / sample_s) / every)
        good = [per_step] * history + [per_step - bad] * burn_steps + [per_step] * recovery
        bads = [0] * history + [bad] * burn_steps + [0] * recovery
        traffic = Traffic(tuple(good), tuple(bads))
        burnt, recovered = history + burn_steps, history + burn_steps + recovery
        fired, after = (
            firing(burn, traffic, burnt, sample_s),
            firing(burn, traffic, recovered, sample_s),
        )
        # The generator's own promise, checked here so a policy that cannot be told apart fails
        # at generation time rather than producing a test that proves nothing.
        assert rule in fired and rule not in after
        assert not any(r.factor is not None and r.factor > rule.factor for r in fired)
        cases.append(PolicyCase(rule, traffic, ((burnt, fired), (recovered, after))))
    return cases


def _burn_mix(rule: AlertRule, next_factor: Decimal | None) -> tuple[int, int]:
    """(events, bad) per step: bad ratio just above factor x budget, at most the next factor's."""
    assert rule.objective is not None and rule.factor is not None
    limit = burn_limit(rule.objective.target, rule.factor)
    # The top rule burns at most twice its factor: far above it, rules with longer windows
    # would fire too despite the good history, and the case would tell less apart.
    above = next_factor if next_factor is not None else 2 * rule.factor
    ceiling = burn_limit(rule.objective.target, above)
    per_step = max(rule.min_events, 10)
    while True:
        bad = math.floor(limit * per_step) + 1
        if bad <= ceiling * per_step and bad < per_step:
            return per_step, bad
        per_step *= 10
