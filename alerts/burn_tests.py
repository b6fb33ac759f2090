"""promtool tests that prove every burn-rate rule, for every tier and objective of the spec.

Each test group feeds every objective its own series at once (an objective drives its tier's
request counters or its SLI's histogram; a second objective on the same series, goodput beside
availability, gets groups where it drives) and checks every burn-rate alert by name, exactly:
at each check time the alerts that fire, and that no other does. Per objective, with the
policy's factors f (14.4, 6, 3 and 1 by default), from t=0 for `burn_s` (an hour once windows
add hourly tiles):

- just above f, then at f: a constant bad ratio one event per step (of `per_step`, at most
  1% of the smallest limit) above f x budget, then exactly f x budget (`>` is strict): the
  rules at f fire on the first and not on the second, so a factor written too high or too
  low fails;
- a fast burn (every event bad), then good: pages and tickets fire; a slow burn (at the
  objective's lowest page factor), then good: the tickets below it fire and no page does.
  After either, each alert resolves once its short window holds too little of the burn
  (after the outage, once good traffic fills more than 1 - factor x budget of the short
  window: when it resolves tells its short window), and none is left once the longest short
  window is all good;
- a busy first step (so many good events that no rule fires while its long window holds
  them), then a fast burn: each rule whose long window is up to 6h fires one evaluation
  after its long window let go of that step, and not before;
- silence, then `min_events` bad events in the last step, then one fewer: every rule fires
  (unless the rate guard asks for more), then none does.

The burn, stop, busy-step and guard groups also check every evaluation where, by the model,
some alert comes or goes, and the one before it, so a short or long window written wrong
fails there. The expected alerts come from `alerts.burn_model` (the recorded windows' counts,
`AlertRule.fires`); the generator checks its own promises on the same model, so a policy the
traffic cannot tell apart fails at generation, not with a test that proves nothing. Dynamic
burn rates are left to tests/integration/test_burn_guards.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

import alerts.policy_tests as policy_tests
from alerts.burn_model import Counts, changes, firing
from alerts.policy_tests import counter_values, expected_alerts
from alerts.records import HOUR_TILES_FROM_S
from alerts.rules import REQUESTS, Links
from slo.alert_rules import AVAILABILITY, GOODPUT, AlertRule
from slo.arithmetic import burn_limit
from slo.promql import le_value, number, prom_duration
from slo.sli import CATALOG, buckets_for
from slo.spec import SLOSpec
from slo.spec.objectives import Objective

_MODEL = "test-model"
_ROUTE = "/v1/completions"
_TIGHTNESS = 100  # one event of a step is at most 1/100 of the smallest limit
_EXACT_UP_TO = 10**6  # events per step are a multiple of the limits' denominators up to this
_LONGEST_PINNED_S = HOUR_TILES_FROM_S  # the long windows the busy first step pins
_FED = ("latency", AVAILABILITY, GOODPUT)  # the objective kinds `_series` writes series for
GROUP_PREFIX = "burn rates: "
Traffic = tuple[tuple[int, ...], tuple[int, ...]]  # (good, bad) per sample step
Promise = tuple[int, float, AlertRule, bool]  # driving lane, when, rule, whether it fires


@dataclass(frozen=True)
class Timing:
    sample_s: float  # the series' sample interval
    grid_s: float  # promtool's rule evaluation interval
    burn_s: float  # how long a burn lasts: a whole check step

    def steps(self, seconds: float) -> int:
        return round(seconds / self.sample_s)


@dataclass(frozen=True)
class Lane:
    """One objective, the static burn-rate rules its traffic is made for (and the dynamic
    ones, which are only watched), with the events of each sample step."""

    objective: Objective
    tier: str
    rules: tuple[AlertRule, ...]
    per_step: int
    dynamic: tuple[AlertRule, ...] = ()

    @property
    def source(self) -> tuple[str, str]:
        """The series it drives: its tier's request counters (availability's and goodput's),
        or its SLI's histogram."""
        return self.tier, self.objective.sli or REQUESTS

    @property
    def watched(self) -> tuple[AlertRule, ...]:
        """Every burn-rate rule on the objective, which the checks expect exactly."""
        return self.rules + self.dynamic

    @property
    def factors(self) -> list[Decimal]:
        return [rule.factor or Decimal(0) for rule in self.rules]

    def limit(self, factor: Decimal) -> Fraction:
        return burn_limit(self.objective.target, factor)

    def bad_at(self, factor: Decimal) -> int:
        """The most bad events of a step whose ratio is not above factor x budget."""
        return math.floor(self.limit(factor) * self.per_step)

    def bad_above(self, factor: Decimal) -> int:
        """The fewest bad events of a step whose ratio is above factor x budget."""
        return self.bad_at(factor) + 1


@dataclass(frozen=True)
class Case:
    """One test group: each driving lane's traffic (by index), and when to check."""

    name: str
    end_s: float
    traffic: dict[int, Traffic]
    checks: tuple[float, ...]
    promises: tuple[Promise, ...] = ()
    follow: bool = True  # also check wherever an alert comes or goes


def lanes(rules: Sequence[AlertRule], timing: Timing) -> list[Lane]:
    """One lane per objective with burn-rate rules whose series this module writes, in rule
    order; an objective of another kind gets none, and tests/unit/alerts/test_burn_tests.py
    fails until `_series` learns its series."""
    by_objective: dict[tuple[str, int], list[AlertRule]] = {}
    for rule in rules:
        objective = rule.objective
        if rule.kind == "burn_rate" and objective is not None and objective.kind in _FED:
            by_objective.setdefault((rule.tier or "", id(rule.objective)), []).append(rule)
    found = []
    for (tier, _), own in by_objective.items():
        objective = own[0].objective
        assert objective is not None
        static = tuple(rule for rule in own if not rule.dynamic)
        dynamic = tuple(rule for rule in own if rule.dynamic)
        per_step = _per_step(objective, static, timing) if static else 0
        found.append(Lane(objective, tier, static, per_step, dynamic))
    return found


def _per_step(objective: Objective, rules: Sequence[AlertRule], timing: Timing) -> int:
    """Events per step: a multiple of every limit's denominator (so `at f` is exactly f x
    budget), fine enough that one event is a small step, and enough for every guard."""
    limits = [burn_limit(objective.target, rule.factor or 0) for rule in rules]
    denominator = math.lcm(*(limit.denominator for limit in limits))
    denominator = denominator if denominator <= _EXACT_UP_TO else 1
    per_step = denominator * math.ceil(_TIGHTNESS / min(limits) / denominator)
    while not all(
        per_step * timing.steps(min(window, timing.burn_s)) >= rule.guard_events(window)
        for rule in rules
        for window in rule.windows_s
    ):
        per_step *= 2
    return per_step


def _steady(steps: int, per_step: int, bad: int, burn_steps: int | None = None) -> Traffic:
    """`bad` of `per_step` events each step for `burn_steps` (default: all), then all good."""
    burn = steps if burn_steps is None else burn_steps
    bads = tuple(bad if step < burn else 0 for step in range(steps))
    return tuple(per_step - b for b in bads), bads


def _ratio_promises(
    drivers: Sequence[Lane], traffic: dict[int, Traffic], at_s: float
) -> tuple[Promise, ...]:
    """At `at_s` each rule fires exactly when the first step's ratio is above its limit."""
    promises = []
    for index, lane in enumerate(drivers):
        (good, *_), (bad, *_) = traffic[index]
        for rule in lane.rules:
            above = Fraction(bad, good + bad) > lane.limit(rule.factor or Decimal(0))
            promises.append((index, at_s, rule, above))
    return tuple(promises)


def _edge_cases(drivers: Sequence[Lane], factors: Sequence[Decimal], timing: Timing) -> list[Case]:
    """Per factor, a steady burn just above it and one at it; a lane without a rule at that
    factor gets good traffic."""
    cases = []
    for factor in factors:
        for above in (True, False):
            traffic = {}
            for index, lane in enumerate(drivers):
                burn = lane.bad_above if above else lane.bad_at
                bad = burn(factor) if factor in lane.factors else 0
                traffic[index] = _steady(timing.steps(timing.burn_s), lane.per_step, bad)
            promises = _ratio_promises(drivers, traffic, timing.burn_s)
            name = f"{'just above' if above else 'at'} {number(factor)}x"
            checks = (timing.burn_s,)
            cases.append(Case(name, timing.burn_s, traffic, checks, promises, follow=False))
    return cases


def _stop_case(drivers: Sequence[Lane], slow: bool, timing: Timing) -> Case:
    """A burn for `burn_s`, then good until the longest short window is all good: fast is
    every event bad, slow at the objective's lowest page factor."""
    longest_short = max(rule.short_window_s or 0.0 for lane in drivers for rule in lane.rules)
    end_s = timing.burn_s + timing.grid_s * math.ceil(longest_short / timing.grid_s)
    traffic = {}
    for index, lane in enumerate(drivers):
        pages = [
            f for f, r in zip(lane.factors, lane.rules, strict=True) if r.severity == "critical"
        ]
        if slow:
            bad = lane.bad_at(min(pages)) if pages else lane.bad_above(max(lane.factors))
        else:
            bad = lane.per_step
        steps, burn_steps = timing.steps(end_s), timing.steps(timing.burn_s)
        traffic[index] = _steady(steps, lane.per_step, bad, burn_steps)
    resolved = tuple(
        (index, end_s, rule, False) for index, lane in enumerate(drivers) for rule in lane.rules
    )
    promises = _ratio_promises(drivers, traffic, timing.burn_s) + resolved
    burn = "slow burn" if slow else "fast burn (all bad)"
    name = f"{burn} for {prom_duration(timing.burn_s)}, then good"
    return Case(name, end_s, traffic, (timing.burn_s, end_s), promises)


def _busy_step_case(drivers: Sequence[Lane], timing: Timing) -> Case | None:
    """A busy first step, then a fast burn: each rule with a long window up to 6h is silent
    while its long window holds that step and fires one evaluation after."""
    pinned = [
        (index, rule)
        for index, lane in enumerate(drivers)
        for rule in lane.rules
        if (rule.long_window_s or 0.0) <= _LONGEST_PINNED_S
    ]
    if not pinned:
        return None
    end_s = max(rule.long_window_s or 0.0 for _, rule in pinned) + timing.grid_s
    burn_steps = timing.steps(end_s) - 1
    traffic = {}
    for index, lane in enumerate(drivers):
        bad = lane.bad_above(max(lane.factors))
        lowest = min(lane.limit(factor) for factor in lane.factors)
        # burn_steps x bad <= lowest x (busy + burn_steps x per_step), with a step to spare.
        busy = math.ceil(burn_steps * (bad - lowest * lane.per_step) / lowest) + lane.per_step
        good = (busy, *([lane.per_step - bad] * burn_steps))
        traffic[index] = (good, (0, *([bad] * burn_steps)))
    promises = tuple(
        (index, (rule.long_window_s or 0.0) + after, rule, bool(after))
        for index, rule in pinned
        for after in (0.0, timing.grid_s)
    )
    checks = (*(when for _, when, _, _ in promises), end_s)
    return Case("a busy first step, then a fast burn", end_s, traffic, checks, promises)


def _guard_cases(drivers: Sequence[Lane], min_events: int, timing: Timing) -> list[Case]:
    """Silence, then `min_events` bad events in the last step; then one fewer."""
    steps = timing.steps(timing.burn_s)
    cases = []
    for count in range(min_events, max(0, min_events - 2), -1):
        traffic = {
            index: ((0,) * steps, (0,) * (steps - 1) + (count,)) for index in range(len(drivers))
        }
        promises = tuple(
            (index, timing.burn_s, rule, all(rule.guard_events(w) <= count for w in rule.windows_s))
            for index, lane in enumerate(drivers)
            for rule in lane.rules
        )
        cases.append(
            Case(f"{count} bad events", timing.burn_s, traffic, (timing.burn_s,), promises)
        )
    return cases


def _counts(driver: Lane, lane: Lane, traffic: Traffic, sample_s: float) -> Counts:
    """`lane`'s counts on the series `driver` drives (itself, or another objective on the
    same series: on a histogram a good observation lies at the driver's threshold, a bad one
    above every bucket; goodput's bad requests are ok, so availability reads them good)."""
    good, bad = traffic
    if lane.objective.kind == "latency" and (lane.objective.threshold_s or 0) < (
        driver.objective.threshold_s or 0
    ):
        good, bad = (0,) * len(good), tuple(g + b for g, b in zip(good, bad, strict=True))
    if lane.objective.kind == AVAILABILITY and driver.objective.kind == GOODPUT:
        good, bad = tuple(g + b for g, b in zip(good, bad, strict=True)), (0,) * len(bad)
    return Counts(good, bad, sample_s)


def _series(spec: SLOSpec, lane: Lane, traffic: Traffic) -> list[dict[str, str]]:
    """The series `lane` drives: a good observation at its threshold, a bad one above every
    bucket; for availability a request ok (and good) or failed; for goodput a request ok and
    good, or ok and not good (it missed a latency objective)."""
    good, bad = traffic
    base = f'tier="{lane.tier}", model="{_MODEL}", route="{_ROUTE}"'
    every = tuple(g + b for g, b in zip(good, bad, strict=True))
    if lane.objective.kind in (AVAILABILITY, GOODPUT):
        fails = lane.objective.kind == AVAILABILITY
        outcomes = policy_tests.Traffic(*((good, bad) if fails else (every, (0,) * len(bad))))
        series = policy_tests.availability_series(lane.tier, outcomes)
        return [*series, policy_tests.good_requests_series(lane.tier, good)]
    sli = lane.objective.sli or ""
    metric, threshold = CATALOG[sli].metric, lane.objective.threshold_s or 0.0
    below = [0] * len(good)
    series = [
        {
            "series": f'{metric}_bucket{{{base}, le="{le_value(bound)}"}}',
            "values": counter_values(good if bound >= threshold else below),
        }
        for bound in buckets_for(sli, spec)
    ]
    series.append(
        {"series": f'{metric}_bucket{{{base}, le="+Inf"}}', "values": counter_values(every)}
    )
    series.append({"series": f"{metric}_count{{{base}}}", "values": counter_values(every)})
    return series


def _group(
    spec: SLOSpec, links: Links, case: Case, lanes_of: Sequence[Sequence[Lane]], timing: Timing
) -> dict[str, Any]:
    """The promtool group of `case`: the first lane of each of `lanes_of` (one per series)
    drives its series, the others on the same series read them too."""
    counts: dict[int, Counts] = {}
    for index, (driver, *riders) in enumerate(lanes_of):
        for lane in (driver, *riders):
            counts[id(lane)] = _counts(driver, lane, case.traffic[index], timing.sample_s)
    pairs = [(rule, counts[id(lane)]) for own in lanes_of for lane in own for rule in lane.watched]
    for index, when, rule, fires_then in case.promises:
        got = bool(firing([(rule, counts[id(lanes_of[index][0])])], when, rule.name))
        assert got == fires_then, (case.name, rule.labels, when, fires_then)
    checks = set(case.checks)
    if case.follow:
        checks.update(changes(pairs, timing.grid_s, case.end_s))
    names = list(dict.fromkeys(rule.name for rule, _ in pairs))
    series = [
        s for index, own in enumerate(lanes_of) for s in _series(spec, own[0], case.traffic[index])
    ]
    return {
        "name": case.name,
        "interval": prom_duration(timing.sample_s),
        "input_series": series,
        "alert_rule_test": [
            {
                "eval_time": prom_duration(when),
                "alertname": name,
                "exp_alerts": expected_alerts(firing(pairs, when, name), spec, links),
            }
            for when in sorted(checks)
            for name in names
        ],
    }


def _by_source(rules: Sequence[AlertRule], timing: Timing) -> dict[tuple[str, str], list[Lane]]:
    by_source: dict[tuple[str, str], list[Lane]] = {}
    for lane in lanes(rules, timing):
        by_source.setdefault(lane.source, []).append(lane)
    return by_source


def _suffix(rank: int) -> str:
    return f" (objectives #{rank + 1} of a tier's series)" if rank else ""


def driving_suffixes(rules: Sequence[AlertRule], timing: Timing) -> dict[int, str]:
    """id(objective) -> the suffix of the groups where it drives its series (burn_groups'
    rank: none for the first on each series); elsewhere it reads another's traffic."""
    drivers = [[lane for lane in own if lane.rules] for own in _by_source(rules, timing).values()]
    return {id(lane.objective): _suffix(rank) for own in drivers for rank, lane in enumerate(own)}


def burn_groups(
    spec: SLOSpec, rules: Sequence[AlertRule], links: Links, timing: Timing
) -> list[dict[str, Any]]:
    """Every burn-rate test group of the spec, named `burn rates: <case>` (`driving_suffixes`
    where a series' next objective drives it)."""
    by_source = _by_source(rules, timing)
    factors = sorted(
        {f for own in by_source.values() for x in own for f in x.factors}, reverse=True
    )
    drive = {source: [lane for lane in own if lane.rules] for source, own in by_source.items()}
    groups = []
    for rank in range(max(map(len, drive.values()), default=0)):
        # The rank-th objective with static rules drives each series; the others read it.
        lanes_of = [
            [drive[source][rank], *(lane for lane in own if lane is not drive[source][rank])]
            for source, own in by_source.items()
            if len(drive[source]) > rank
        ]
        drivers = [own[0] for own in lanes_of]
        cases = _edge_cases(drivers, factors, timing)
        cases += [_stop_case(drivers, False, timing), _stop_case(drivers, True, timing)]
        cases += [case for case in [_busy_step_case(drivers, timing)] if case is not None]
        cases += _guard_cases(drivers, spec.alert_policy.min_events, timing)
        suffix = _suffix(rank)
        for case in cases:
            group = _group(spec, links, case, lanes_of, timing)
            group["name"] = f"{GROUP_PREFIX}{group['name']}{suffix}"
            groups.append(group)
    return groups
