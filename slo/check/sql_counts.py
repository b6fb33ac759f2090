"""From counts to the evaluator's report, for judges that count in a database.

`slo check --db postgresql://...` never holds the records: the database returns, per tier and
per alert-window bucket, how many events each objective has and how many of them are good,
and the nearest-rank value at each percentile asked for. This module states what must be
counted for a spec (`CountPlan`) and turns those counts into the very `EvaluationReport` that
`slo.check.evaluate.evaluate` builds from columns: the verdict, burn-rate and alert rules are the
core's own (`objective_result`, `burn_rates`, `rank_for`), called with the same numbers.

A record's bucket is the shortest alert window it falls in (windows are nested: a record in
the 5m window is in every longer one), so the count of window i is the sum of buckets 0..i.
Bucket -1 holds records that start after `now` (outside the window, as in `evaluate`); the
last bucket, those in the SLO window but in no alert window.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from slo.arithmetic import goodput_checks
from slo.check.evaluate import (
    CLIENT_VIEW,
    Burn,
    EvaluationReport,
    ObjectiveResult,
    TierResult,
    Verdict,
    burn_rates,
    objective_result,
    rank_for,
)
from slo.performance import classify
from slo.sli import CATALOG, OUTCOMES_EXCLUDED_FROM_AVAILABILITY
from slo.spec import SLOSpec, Tier
from slo.spec.objectives import Objective
from slo.units import format_duration

FUTURE_BUCKET = -1
ITL_FIELD = "itl_s"
# The classification reads p95 TTFT and TPOT of every tier, objectives or not.
CLASSIFY_FIELDS: tuple[str, ...] = ("ttft_s", "tpot_s")
CLASSIFY_TARGET = 0.95

Condition = tuple[str, float, bool]  # (record field, threshold_s, inclusive): "field <= T"


def record_field(objective: Objective) -> str:
    return CATALOG[objective.sli or ""].record_field or ""


def condition(objective: Objective) -> Condition:
    return (record_field(objective), objective.threshold_s or 0.0, objective.inclusive)


@dataclass(frozen=True)
class CountPlan:
    """Everything one spec asks the database to count, each thing once across tiers."""

    fields: tuple[str, ...]  # per-request SLI fields: events and percentiles
    client_fields: tuple[str, ...]  # fields whose client view is counted (client_view_events)
    conditions: tuple[Condition, ...]  # per-request "good" tests, one count each
    goodputs: tuple[tuple[Condition, ...], ...]  # per goodput objective: the tests it ANDs
    gap_conditions: tuple[Condition, ...]  # ITL: per-gap tests
    gap_tiers: tuple[str, ...]  # tiers with an ITL objective

    @classmethod
    def of(cls, spec: SLOSpec) -> CountPlan:
        fields = dict.fromkeys(CLASSIFY_FIELDS)
        client_fields: dict[str, None] = {}
        conditions: dict[Condition, None] = {}
        gap_conditions: dict[Condition, None] = {}
        goodputs: dict[tuple[Condition, ...], None] = {}
        gap_tiers: dict[str, None] = {}
        for tier in spec.tiers:
            if any(objective.kind == "goodput" for objective in tier.objectives):
                goodputs[goodput_conditions(tier)] = None
                fields.update(dict.fromkeys(test[0] for test in goodput_conditions(tier)))
            for objective in tier.objectives:
                if objective.kind != "latency":
                    continue
                name = record_field(objective)
                if name == ITL_FIELD:
                    gap_conditions[condition(objective)] = None
                    gap_tiers[tier.name] = None
                    continue
                fields[name] = None
                if name in CLIENT_VIEW:
                    client_fields[name] = None
                conditions[condition(objective)] = None
        return cls(
            tuple(fields),
            tuple(client_fields),
            tuple(conditions),
            tuple(goodputs),
            tuple(gap_conditions),
            tuple(gap_tiers),
        )

    @cached_property
    def chains(self) -> dict[str, list[Condition]]:
        """Each field's chain of tests (`chain`), worked out once: `add_group` runs per group."""
        return {name: chain(self.conditions, name) for name in self.fields}


def chain(tests: Iterable[Condition], field_name: str) -> list[Condition]:
    """A field's tests, each implied by the one before ("< T" before "<= T" before "< T'",
    T < T'): a value's level (the first test it passes) says every test it passes."""
    return sorted({t for t in tests if t[0] == field_name}, key=lambda t: (t[1], t[2]))


def percentile_ranks(spec_tier: Tier, field_name: str, events: int) -> list[int]:
    """The 1-based nearest ranks of `field_name` that a tier's report shows, fewest first."""
    if events == 0:
        return []
    targets = [o.target for o in spec_tier.latency_objectives if record_field(o) == field_name]
    if field_name in CLASSIFY_FIELDS:
        targets.append(CLASSIFY_TARGET)
    return sorted({rank_for(target, events) for target in targets})


def fraction_for_rank(rank: int, events: int) -> float:
    """A fraction whose SQL `percentile_disc` is the `rank`-th smallest of `events` values.

    percentile_disc(f) is the first value whose position reaches f * n (PostgreSQL computes
    the position as ceil(f * n)). Half a rank below the rank itself keeps ceil() on the rank
    whatever the rounding of f * n: the error is far below 0.5 for any count a table holds.
    """
    return (rank - 0.5) / events


@dataclass
class TierCounts:
    """One tier's counts, each an array over buckets 0..len(windows) (bucket -1 excluded)."""

    buckets: int
    counts: dict[str, np.ndarray] = field(default_factory=dict)
    future: int = 0  # records that start after `now`
    start: float | None = None  # first start of an ok request
    end: float | None = None  # last end (start + e2e) of an ok request
    tokens: int = 0  # output tokens of ok requests
    client_gaps: bool = False  # the tier has client-side inter-token gaps (client ITL wins)
    percentiles: dict[tuple[str, int], float] = field(default_factory=dict)  # (field, rank)
    # field: value region: judged values (regions cut by sampled bounds, see slo.check.sql_ranks)
    regions: dict[str, dict[int, int]] = field(default_factory=dict)

    def add(self, key: str, bucket: int, value: int) -> None:
        if key not in self.counts:
            self.counts[key] = np.zeros(self.buckets, dtype=np.int64)
        self.counts[key][bucket] += value

    def total(self, key: str) -> int:
        values = self.counts.get(key)
        return int(values.sum()) if values is not None else 0

    def cumulative(self, key: str) -> np.ndarray:
        values = self.counts.get(key)
        return np.cumsum(values) if values is not None else np.zeros(self.buckets, np.int64)

    def span(self, start: float | None, end: float | None) -> None:
        if start is not None:
            self.start = start if self.start is None else min(self.start, start)
        if end is not None:
            self.end = end if self.end is None else max(self.end, end)

    @property
    def tokens_per_s(self) -> float | None:
        """As `evaluate` computes it: ok requests' tokens over first start to last end."""
        if self.start is None or self.end is None:
            return None
        span = self.end - self.start
        return float(self.tokens) / span if span > 0 else None


# Keys of the counts: one name per thing counted, shared by the query and the report.
def events_key(field_name: str) -> str:
    return f"events:{field_name}"


def client_key(field_name: str) -> str:
    return f"client:{field_name}"


def good_key(test: Condition) -> str:
    return f"good:{test[0]}:{test[1]!r}:{'le' if test[2] else 'lt'}"


def goodput_key(tests: Sequence[Condition]) -> str:
    return "goodput:" + "&".join(good_key(test) for test in tests)


def gap_key(test: Condition | None) -> str:
    return "gaps" if test is None else "gap" + good_key(test)


@dataclass(frozen=True)
class Group:
    """One grouped row of the counting scan: records alike in everything counted."""

    bucket: int
    outcome: str
    levels: Mapping[str, int | None]  # field: index of the first test of its chain it passes
    client: Mapping[str, bool]  # client-view column: has a value
    client_gaps: bool  # has a non-empty client ITL list
    n: int
    tokens: int | None  # output tokens of the group's ok records
    start: float | None  # first start of an ok record
    end: float | None  # last end of an ok record


def add_group(plan: CountPlan, group: Group, counts: TierCounts) -> int:
    """Adds one group to its tier's counts; returns its records with a client view.

    Every judge that counts in a database groups by level and calls this, so that each count
    means the same thing whichever database made it."""
    n, bucket, outcome, levels = group.n, group.bucket, group.outcome, group.levels
    if bucket == FUTURE_BUCKET:
        counts.future += n
        return 0
    ok = outcome == "ok"
    counts.add("records", bucket, n)
    counts.add("ok", bucket, n if ok else 0)
    counts.add("counted", bucket, 0 if outcome in OUTCOMES_EXCLUDED_FROM_AVAILABILITY else n)
    counts.add("client_gaps", bucket, n if group.client_gaps else 0)
    chains = plan.chains
    for name in plan.fields:
        level = levels[name]
        counts.add(events_key(name), bucket, n if ok and level is not None else 0)
        for index, test in enumerate(chains[name]):
            good = ok and level is not None and level <= index
            counts.add(good_key(test), bucket, n if good else 0)
    for name in plan.client_fields:
        counts.add(client_key(name), bucket, n if group.client[CLIENT_VIEW[name]] else 0)
    for tests in plan.goodputs:
        passes = all(
            levels[t[0]] is None or levels[t[0]] <= chains[t[0]].index(t)  # type: ignore[operator]
            for t in tests
        )
        counts.add(goodput_key(tests), bucket, n if ok and passes else 0)
    if ok:
        counts.tokens += int(group.tokens or 0)
        counts.span(group.start, group.end)
    return n if group.client["client_ttft_s"] or group.client["client_e2e_s"] else 0


def build_report(
    spec: SLOSpec,
    now: float,
    tiers: Mapping[str, TierCounts],
    client_view_records: int,
) -> EvaluationReport:
    """The report `evaluate` makes of the same records (`tiers` holds every tier seen, the
    spec's and strays; each count already limited to [now - window, now] but bucket -1)."""
    windows = spec.alert_policy.windows_s
    records = sum(counts.total("records") for counts in tiers.values())
    outside = sum(counts.future for counts in tiers.values())
    notes: list[str] = []
    if outside:
        notes.append(
            f"{outside} records outside the {format_duration(spec.window_s)} window were left out"
        )
    known = {tier.name for tier in spec.tiers}
    strays = sorted(
        name for name, counts in tiers.items() if name not in known and counts.total("records")
    )
    if strays:
        stray_records = sum(tiers[name].total("records") for name in strays)
        notes.append(
            f"{stray_records} records of tiers the spec does not define were left "
            f"out: {', '.join(strays[:5])}"
        )
    results = []
    for tier in spec.tiers:
        counts = tiers.get(tier.name) or TierCounts(len(windows) + 1)
        results.append(_tier_result(spec, tier, counts, windows))
    return EvaluationReport(results, spec.window_s, now, records, client_view_records, notes)


def _tier_result(
    spec: SLOSpec, tier: Tier, counts: TierCounts, windows: Sequence[float]
) -> TierResult:
    results = []
    for objective in tier.objectives:
        if objective.kind == "latency":
            results.append(_latency(spec, tier, objective, counts, windows))
        elif objective.kind == "availability":
            results.append(_ratio(spec, tier, objective, counts, "counted", "ok", windows))
        elif objective.kind == "goodput":
            good = goodput_key(goodput_conditions(tier))
            results.append(_ratio(spec, tier, objective, counts, "counted", good, windows))
        else:
            results.append(_throughput(spec, tier, objective, counts))
    p95 = {
        name: _observed(counts, name, counts.total(events_key(name)), CLASSIFY_TARGET)
        for name in CLASSIFY_FIELDS
    }
    performance = classify(p95["ttft_s"], p95["tpot_s"], counts.tokens_per_s)
    return TierResult(tier.name, counts.total("records"), results, performance)


def goodput_conditions(tier: Tier) -> tuple[Condition, ...]:
    """The tests a good request of the tier passes: the core's goodput checks."""
    checks = goodput_checks(tier.latency_objectives)
    return tuple((check.field, check.threshold_s, check.inclusive) for check in checks)


def _observed(counts: TierCounts, field_name: str, events: int, target: float) -> float | None:
    if events == 0:
        return None
    return counts.percentiles[(field_name, rank_for(target, events))]


def _latency(
    spec: SLOSpec, tier: Tier, objective: Objective, counts: TierCounts, windows: Sequence[float]
) -> ObjectiveResult:
    name = record_field(objective)
    if name == ITL_FIELD:
        events_name, good_name = gap_key(None), gap_key(condition(objective))
    else:
        events_name, good_name = events_key(name), good_key(condition(objective))
    events, good = counts.total(events_name), counts.total(good_name)
    observed = _observed(counts, name, events, objective.target)
    burn = _burn(spec, objective, counts, events_name, good_name, windows)
    if name == ITL_FIELD:
        client_events = events if counts.client_gaps else 0
    else:
        client_events = counts.total(client_key(name)) if name in CLIENT_VIEW else 0
    return objective_result(spec, tier.name, objective, events, good, burn, observed, client_events)


def _ratio(
    spec: SLOSpec,
    tier: Tier,
    objective: Objective,
    counts: TierCounts,
    events_name: str,
    good_name: str,
    windows: Sequence[float],
) -> ObjectiveResult:
    events, good = counts.total(events_name), counts.total(good_name)
    burn = _burn(spec, objective, counts, events_name, good_name, windows)
    return objective_result(spec, tier.name, objective, events, good, burn)


def _burn(
    spec: SLOSpec,
    objective: Objective,
    counts: TierCounts,
    events_name: str,
    good_name: str,
    windows: Sequence[float],
) -> Burn:
    events, good = counts.cumulative(events_name), counts.cumulative(good_name)
    per_window = {w: (int(events[i]), int(events[i] - good[i])) for i, w in enumerate(windows)}
    total_events = counts.total(events_name)
    total = (total_events, total_events - counts.total(good_name))
    return burn_rates(spec, objective, per_window, total)


def _throughput(
    spec: SLOSpec, tier: Tier, objective: Objective, counts: TierCounts
) -> ObjectiveResult:
    # evaluate's `_throughput`, on the counted figures (see the report: a hook there would
    # let both call one function).
    rate = counts.tokens_per_s
    events = counts.total("ok")
    if rate is None or events < spec.min_events:
        verdict: Verdict = "insufficient_data"
    else:
        verdict = "met" if rate >= (objective.min_tokens_per_s or 0.0) else "violated"
    met = verdict == "met"
    return ObjectiveResult(tier.name, objective, events, events if met else 0, verdict, None, rate)
