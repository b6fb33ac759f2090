"""Every alert a spec implies, as data: the one definition Prometheus and the middleware share.

`alert_rules(spec)` lists them; `alerts/` renders them as Prometheus rules and the middleware's
in-process evaluator evaluates the same list, so both agree on which alerts fire.

Semantics (Prometheus evaluates exactly this; an in-process evaluator must do the same):

- Event. For a latency objective on SLI `x`: one observation of `x`'s histogram, i.e. one
  finished request for ttft, tpot, e2e and the phases (tpot only for requests with at least
  two output tokens, as the middleware observes it) and one inter-token gap for itl. For
  availability: one finished request whose outcome is not in
  `OUTCOMES_EXCLUDED_FROM_AVAILABILITY` (client errors and cancellations say nothing about
  the service). For goodput: the same requests as availability.
- Bad event. Latency: the value is above the objective's threshold, i.e. not counted in the
  histogram bucket `le=threshold` (a value equal to the threshold is good, also for a strict
  `<` objective: a histogram cannot tell equality apart). Availability: any outcome but `ok`.
  Goodput: a request not in `llm_slo_good_requests_total` (ok and every latency objective of
  its tier met, per request by `slo.arithmetic.good_request`: a strict `<` is exact).
- Error ratio over a window W at time t: bad events / events in (t - W, t], summed over every
  model, route and replica of the tier (event-weighted: a ratio of summed counts, never an
  average of per-replica ratios). Undefined (no alert) when there are no events.
- Error budget: 1 - target (`error_budget(objective)`), an exact decimal. All of this
  arithmetic (budget, burn-rate limit, the comparisons) is `slo.arithmetic`'s.
- Low-traffic guard: an alert fires only if every window it looks at holds at least
  `min_events` events (`spec.alert_policy.min_events`); with fewer, one slow request would
  page someone.
- burn_rate (multi-window, multi-burn-rate, SRE workbook): fires at t iff, for both the long
  and the short window, events >= min_events and error ratio > factor x error budget (strict:
  `slo.arithmetic.BURN_RATE_OPERATOR`, the operator the generated PromQL uses).
  A rule whose factor x budget >= 1 could never fire; it is left out (see `unreachable`).
- threshold (operations practice: p95 > 2x target, p99 > 3x, p50 above target for 15m):
  fires at t iff events in `window_s` >= min_events and the `percentile` of the SLI over
  `window_s` is above `threshold_s` (= factor x the objective's threshold), and has been at
  every evaluation for `for_s` (Prometheus `for`). The percentile is Prometheus'
  `histogram_quantile` over the window's bucket increases; `histogram_quantile` below is the
  same computation, to run on the same bucket counts in-process. A threshold at or above the
  highest finite bucket bound could never be reached; such alerts are left out too.
- absent: fires when no series of the requests counter has existed for `for_s`, i.e. the
  middleware is not mounted or not scraped. Only Prometheus can see that; in-process skip it.

Severity: the policy's `page` -> critical, `ticket` -> warning (critical/warning/info are
accepted as written); threshold alerts are warnings, except a factor <= 1 (the sustained-p50
drift) which is info; absent is a warning.
"""

from __future__ import annotations

import bisect
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from slo.arithmetic import (
    Count,
    alerts_on_budget,
    as_decimal,
    burn_limit,
    burn_rule_fires,
    dynamic_burning,
    rate_guarded,
)
from slo.arithmetic import error_budget as arithmetic_error_budget
from slo.promql import exact, number, prom_duration
from slo.sli import AFTER_FIRST_TOKEN, BEFORE_FIRST_TOKEN, CATALOG, PHASES, buckets_for
from slo.spec import SLOSpec, Tier
from slo.spec.alert_policy import BurnRateRule, ThresholdAlert
from slo.spec.objectives import Objective

AlertKind = Literal["burn_rate", "threshold", "absent"]
Severity = Literal["critical", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("critical", "warning", "info")
_POLICY_SEVERITY: dict[str, Severity] = {
    "page": "critical",
    "ticket": "warning",
    "critical": "critical",
    "warning": "warning",
    "info": "info",
}
AVAILABILITY = "availability"  # the `sli` label of availability objectives
GOODPUT = "goodput"  # the `sli` label of goodput objectives
# Page, ticket or info: a label of its own for routing and inhibition (Pyrra #1884), so a
# config need not know which severities page.
URGENCY_LABEL = "urgency"
URGENCY: dict[Severity, str] = {"critical": "page", "warning": "ticket", "info": "info"}
ABSENT_FOR_S = 600.0
_DEFAULT_THRESHOLD_WINDOW_S = 300.0
_BURN_RULES: dict[int, dict[int, list[AlertRule]]] = {}  # id(spec) -> id(objective) -> rules
_ACRONYMS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}
# The phase to blame: a latency alert carries the label `phase`, the phase (of those its SLI is
# made of) whose mean grew most against its baseline, or UNATTRIBUTED when Prometheus has no
# phase timings for the tier (`slo.sli.BEFORE_FIRST_TOKEN` make up TTFT, `AFTER_FIRST_TOKEN`
# TPOT and ITL; e2e is every phase).
PHASE_LABEL = "phase"
UNATTRIBUTED = "unknown"


def phases_of(sli: str | None) -> tuple[str, ...]:
    """The phases an SLI is made of, in `PHASES` order; () for availability and non-latency.
    Goodput, missed by any latency of a request, blames any phase, as e2e does."""
    if sli in PHASES:
        return (sli,)
    if sli == "ttft":
        return BEFORE_FIRST_TOKEN
    if sli in ("tpot", "itl"):
        return AFTER_FIRST_TOKEN
    if sli in ("e2e", GOODPUT):
        return PHASES
    return ()


@dataclass(frozen=True, slots=True)
class AlertRule:
    """One alert. Fields that do not apply to its kind are None."""

    name: str
    kind: AlertKind
    severity: Severity
    tier: str | None = None
    objective: Objective | None = None
    sli: str | None = None  # `Objective.indicator`: a catalog SLI, availability or goodput
    long_window_s: float | None = None
    short_window_s: float | None = None
    factor: Decimal | None = None
    percentile: Decimal | None = None  # 0..100
    threshold_s: Decimal | None = None  # threshold alerts: factor x the objective's threshold
    window_s: float | None = None  # threshold alerts: the window the percentile is taken over
    for_s: float = 0.0
    min_events: int = 0
    dynamic: bool = False  # burn_rate: Pyrra's dynamic threshold (needs slo_window_s)
    slo_window_s: float | None = None
    min_rate: Decimal = Decimal(0)  # events per second every window must hold

    @property
    def error_budget(self) -> Decimal | None:
        return error_budget(self.objective) if self.objective is not None else None

    @property
    def max_error_ratio(self) -> Decimal | None:
        """burn_rate: the error ratio both windows must exceed (factor x error budget)."""
        budget = self.error_budget
        if self.kind != "burn_rate" or budget is None or self.factor is None:
            return None
        return as_decimal(burn_limit(self.objective.target if self.objective else 0, self.factor))

    @property
    def windows_s(self) -> tuple[float, ...]:
        """The windows whose event counts the low-traffic guard checks."""
        if self.kind == "burn_rate":
            return (self.long_window_s or 0.0, self.short_window_s or 0.0)
        if self.kind == "threshold":
            return (self.window_s or 0.0,)
        return ()

    @property
    def counted_windows_s(self) -> tuple[float, ...]:
        """The windows whose (bad, events) `fires` takes: the guarded ones, then, for a
        dynamic burn rate, the SLO window."""
        extra = (self.slo_window_s or 0.0,) if self.dynamic else ()
        return (*self.windows_s, *extra)

    def guard_events(self, window_s: float) -> Decimal:
        """The fewest events a window must hold: both low-traffic guards in one number."""
        return max(Decimal(self.min_events), self.min_rate * exact(window_s))

    def fires(self, counts: Sequence[tuple[Count, Count]]) -> bool:
        """burn_rate: whether it fires on (bad, events) per `counted_windows_s`; every judge
        calls this, and it calls `slo.arithmetic` only."""
        assert self.kind == "burn_rate" and self.objective is not None
        target, factor = self.objective.target, self.factor or 0
        guarded = all(
            rate_guarded(events, window, self.min_rate)
            for (_, events), window in zip(counts, self.windows_s, strict=False)
        )
        if not self.dynamic:
            return guarded and burn_rule_fires(counts, target, factor, self.min_events)
        *windows, (_, slo_events) = counts
        return guarded and all(
            events >= self.min_events
            and events > 0
            and dynamic_burning(bad, slo_events, window, self.slo_window_s or 0, target, factor)
            for (bad, events), window in zip(windows, self.windows_s, strict=True)
        )

    @property
    def phases(self) -> tuple[str, ...]:
        """The phases this alert may blame (its SLI's); () when it carries no `phase`."""
        return phases_of(self.sli) if self.kind in ("burn_rate", "threshold") else ()

    def labels_with_phase(self, phase: str = UNATTRIBUTED) -> dict[str, str]:
        """The labels Prometheus shows: the rule's, plus the blamed phase where it blames one."""
        return {**self.labels, PHASE_LABEL: phase} if self.phases else dict(self.labels)

    @property
    def labels(self) -> dict[str, str]:
        """The rule's own labels (plus `alertname`); the expression adds `phase`."""
        labels: dict[str, str] = {"severity": self.severity, URGENCY_LABEL: URGENCY[self.severity]}
        if self.tier is not None:
            labels["tier"] = self.tier
        if self.sli is not None:
            labels["sli"] = self.sli
        if self.objective is not None:
            labels["objective"] = self.objective.name
        if self.kind == "burn_rate":
            labels["long_window"] = prom_duration(self.long_window_s or 0.0)
            labels["short_window"] = prom_duration(self.short_window_s or 0.0)
        if self.kind == "threshold" and self.percentile is not None:
            labels["percentile"] = number(self.percentile)
        return labels


def error_budget(objective: Objective) -> Decimal:
    """The fraction of events allowed to be bad: 1 - target, exactly (99.9% -> 0.001)."""
    return as_decimal(arithmetic_error_budget(objective.target))


def sli_title(sli: str) -> str:
    """'ttft' -> 'TTFT', 'queue' -> 'Queue', for alert names and titles."""
    return _ACRONYMS.get(sli, sli.replace("_", " ").title().replace(" ", ""))


def alert_name(kind: AlertKind, sli: str | None = None) -> str:
    if kind == "absent":
        return "LLMSLOMetricsAbsent"
    title = sli_title(sli or "")
    return f"LLMSLO{title}BudgetBurn" if kind == "burn_rate" else f"LLMSLO{title}PercentileHigh"


def budget_objectives(tier: Tier) -> tuple[Objective, ...]:
    """Objectives Prometheus can judge from the exported metrics: latency, availability and
    goodput (`slo.arithmetic.alerts_on_budget`). Throughput has no error budget; it is judged
    from records (`slo check`) and from its counter's rate."""
    return tuple(o for o in tier.objectives if alerts_on_budget(o))


def threshold_window_s(spec: SLOSpec) -> float:
    """Threshold alerts look at the policy's shortest window (5m by default)."""
    return min(spec.alert_policy.windows_s, default=_DEFAULT_THRESHOLD_WINDOW_S)


def alert_rules(spec: SLOSpec) -> list[AlertRule]:
    """Every alert of the spec, in a stable order: per tier, per objective, per policy rule."""
    rules = [rule for rule, reason in _candidates(spec) if reason is None]
    rules.append(
        AlertRule(alert_name("absent"), "absent", "warning", for_s=ABSENT_FOR_S, min_events=0)
    )
    return rules


def burn_rules(spec: SLOSpec, objective: Objective) -> tuple[AlertRule, ...]:
    """The burn-rate alerts on `objective`, built once per spec (specs are immutable; the
    entry goes with the spec): every judge asks this per objective, per call."""
    by_objective = _BURN_RULES.get(id(spec))
    if by_objective is None:
        by_objective = {}
        for rule in alert_rules(spec):
            if rule.kind == "burn_rate" and rule.objective is not None:
                by_objective.setdefault(id(rule.objective), []).append(rule)
        _BURN_RULES[id(spec)] = by_objective
        weakref.finalize(spec, _BURN_RULES.pop, id(spec), None)
    return tuple(by_objective.get(id(objective), ()))


def unreachable(spec: SLOSpec) -> list[str]:
    """Why each left-out alert could never fire, one line each, for `slo generate` to print."""
    return [reason for _, reason in _candidates(spec) if reason is not None]


def windows_s(spec: SLOSpec) -> tuple[float, ...]:
    """Every window recorded: the policy's, the threshold alerts' and the SLO window."""
    windows = {*spec.alert_policy.windows_s, threshold_window_s(spec), spec.window_s}
    return tuple(sorted(windows))


def _candidates(spec: SLOSpec) -> list[tuple[AlertRule, str | None]]:
    policy = spec.alert_policy
    found: list[tuple[AlertRule, str | None]] = []
    for tier in spec.tiers:
        for objective in budget_objectives(tier):
            for burn in policy.burn_rates:
                found.append(_burn_rate(spec, tier, objective, burn))
            if objective.kind == "latency":
                for alert in policy.thresholds:
                    found.append(_threshold(spec, tier, objective, alert))
    return found


def _burn_rate(
    spec: SLOSpec, tier: Tier, objective: Objective, burn: BurnRateRule
) -> tuple[AlertRule, str | None]:
    sli = objective.indicator
    rule = AlertRule(
        alert_name("burn_rate", sli),
        "burn_rate",
        _POLICY_SEVERITY.get(burn.severity, "warning"),
        tier=tier.name,
        objective=objective,
        sli=sli,
        long_window_s=burn.long_window_s,
        short_window_s=burn.short_window_s,
        factor=exact(burn.factor),
        min_events=spec.alert_policy.min_events,
        dynamic=burn.dynamic,
        slo_window_s=spec.window_s if burn.dynamic else None,
        min_rate=exact(spec.alert_policy.min_request_rate),
    )
    limit = rule.max_error_ratio
    if limit is not None and limit >= 1 and not burn.dynamic:
        return rule, (
            f"tier {tier.name!r}, objective {objective.name!r}: burn rate {number(burn.factor)} "
            f"over {prom_duration(burn.long_window_s)}/{prom_duration(burn.short_window_s)} "
            f"needs an error ratio above {number(limit)}, which cannot happen; alert left out"
        )
    return rule, None


def _threshold(
    spec: SLOSpec, tier: Tier, objective: Objective, alert: ThresholdAlert
) -> tuple[AlertRule, str | None]:
    sli = objective.sli or ""
    factor = exact(alert.factor)
    threshold = factor * exact(objective.threshold_s or 0.0)
    rule = AlertRule(
        alert_name("threshold", sli),
        "threshold",
        "info" if factor <= 1 else "warning",
        tier=tier.name,
        objective=objective,
        sli=sli,
        factor=factor,
        percentile=exact(alert.percentile),
        threshold_s=threshold,
        window_s=threshold_window_s(spec),
        for_s=alert.for_s,
        min_events=spec.alert_policy.min_events,
    )
    top = max(buckets_for(sli, spec))
    if threshold >= exact(top):
        metric = CATALOG[sli].metric
        return rule, (
            f"tier {tier.name!r}, objective {objective.name!r}: p{number(alert.percentile)} > "
            f"{number(threshold)}s can never be seen, the highest bucket of {metric} is "
            f"{number(top)}s; alert left out"
        )
    return rule, None


def histogram_quantile(quantile: float, buckets: Sequence[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile on cumulative (upper bound, count) pairs, +Inf last.

    Linear interpolation inside the bucket holding the rank, the lowest bucket starting at 0;
    a rank in the +Inf bucket yields the highest finite bound. NaN without observations.
    """
    if quantile < 0:
        return -math.inf
    if quantile > 1:
        return math.inf
    ordered = sorted(buckets)
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]) or ordered[-1][1] == 0:
        return math.nan
    bounds = [bound for bound, _ in ordered]
    counts = [count for _, count in ordered]
    for index in range(1, len(counts)):  # Prometheus repairs non-monotonic counts the same way
        counts[index] = max(counts[index], counts[index - 1])
    rank = quantile * counts[-1]
    index = bisect.bisect_left(counts[:-1], rank)
    if index == len(counts) - 1:
        return bounds[-2]
    if index == 0 and bounds[0] <= 0:
        return bounds[0]
    start = 0.0 if index == 0 else bounds[index - 1]
    below = 0.0 if index == 0 else counts[index - 1]
    in_bucket = counts[index] - below
    if in_bucket == 0:
        return bounds[index]
    return start + (bounds[index] - start) * (rank - below) / in_bucket


def unbucketed_thresholds(spec: SLOSpec) -> list[str]:
    """Objective thresholds that are not a bucket bound of their histogram, one line each.

    `buckets_for` adds every threshold, so this is empty unless the two drift apart; then an
    objective would be judged by interpolation inside a bucket, so generation refuses.
    """
    problems = []
    for tier in spec.tiers:
        for objective in tier.latency_objectives:
            sli = objective.sli or ""
            bounds = buckets_for(sli, spec)
            if objective.threshold_s not in bounds:
                problems.append(
                    f"{spec.source}:{objective.line}: tier {tier.name!r}: threshold "
                    f"{number(objective.threshold_s or 0)}s of {objective.name!r} is not a bucket "
                    f"bound of {CATALOG[sli].metric} ({', '.join(number(b) for b in bounds)}); "
                    "the middleware and the rules must read the same spec: pass it to both"
                )
    return problems
