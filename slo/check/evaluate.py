"""Judge records against a spec: per tier and objective, attainment, budget, burn and verdict.

Percentiles are nearest-rank: the value of the ceil(q * n)-th fastest event, always a value
some request really had. With that definition "p95 x <= T" holds exactly when at least 95% of
events have x <= T, so the percentile form and the ratio form of an objective always agree.
(`vllm bench serve` interpolates linearly between ranks; the two differ by less than the gap
between neighbouring events.) Columnar numpy throughout: each objective costs a few passes
over its column (`np.partition` finds a percentile in linear time), never a sort.

Which events count:
- latency objectives: requests with outcome ok that have a value (tpot needs two tokens);
  itl counts every gap, not requests.
- availability: ok over every request except client_error and cancelled.
- goodput: requests (same population as availability) that are ok and meet every per-request
  latency objective of their tier; a missing value (tpot of a one-token reply) passes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from slo import arithmetic
from slo.arithmetic import Verdict, goodput_checks
from slo.check.burn import WindowBurn, burn_rates
from slo.performance import Classification, classify
from slo.sli import CATALOG, OUTCOMES_EXCLUDED_FROM_AVAILABILITY
from slo.spec import SLOSpec, Tier
from slo.spec.objectives import Objective
from slo.units import format_duration

if TYPE_CHECKING:
    # Only for types: the judges that count elsewhere (`slo check --results` in DuckDB, --db on
    # PostgreSQL) import this module, and slo.store.columns pulls in sqlmodel and SQLAlchemy.
    from slo.records import RequestRecord
    from slo.store.columns import RecordColumns

# The client view of an SLI (filled by `slo bench`) wins where present: it is what the person
# waiting saw. Phases have no client view.
CLIENT_VIEW = {
    "ttft_s": "client_ttft_s",
    "e2e_s": "client_e2e_s",
    "tpot_s": "client_tpot_s",
    "itl_s": "client_itl_s",
}
# What `slo.check.burn.burn_rates` returns: the burn per alert window, the rules firing.
Burn = tuple[tuple[WindowBurn, ...], tuple[str, ...]]


def rank_for(target: float, count: int) -> int:
    """1-based nearest rank of the target quantile among `count` events: ceil(q * n), exactly.

    The same number as `required_good`: the q-th percentile is within the threshold exactly
    when at least that many events are, so both forms of an objective agree.
    """
    return max(1, arithmetic.required_good(target, count))


def nearest_rank(values: np.ndarray, target: float) -> float:
    """The nearest-rank percentile (linear time: a partition, not a sort)."""
    if values.size == 0:
        return math.nan
    index = rank_for(target, values.size) - 1
    return float(np.partition(values, index)[index])


def required_good(target: float, count: int) -> int:
    """How many of `count` events must be good for attainment >= target (exact target)."""
    return arithmetic.required_good(target, count)


@dataclass(frozen=True, slots=True)
class ObjectiveResult:
    tier: str
    objective: Objective
    events: int
    good: int
    verdict: Verdict
    observed_s: float | None = None  # nearest-rank value at the target quantile
    tokens_per_s: float | None = None
    burn: tuple[WindowBurn, ...] = ()
    alerts: tuple[str, ...] = ()  # burn-rate rules firing now, e.g. "page 1h/5m x14.4"
    client_view_events: int = 0

    @property
    def attainment(self) -> float | None:
        return self.good / self.events if self.events else None

    @property
    def error_budget(self) -> float:
        return 1.0 - self.objective.target

    @property
    def budget_remaining(self) -> float | None:
        """1 = untouched, 0 = spent, negative = overspent."""
        if not self.objective.has_error_budget:
            return None
        return arithmetic.budget_remaining(self.good, self.events, self.objective.target)

    def to_dict(self) -> dict[str, Any]:
        objective = self.objective
        return {
            "objective": objective.name,
            "kind": objective.kind,
            "sli": objective.sli,
            "form": objective.form if objective.kind == "latency" else None,
            "target": objective.target if objective.has_error_budget else None,
            "threshold_s": objective.threshold_s,
            "min_tokens_per_s": objective.min_tokens_per_s,
            "events": self.events,
            "good": self.good,
            "attainment": self.attainment,
            "observed_s": self.observed_s,
            "tokens_per_s": self.tokens_per_s,
            "error_budget": round(self.error_budget, 12) if objective.has_error_budget else None,
            "budget_remaining": self.budget_remaining,
            "burn_rates": [burn.to_dict() for burn in self.burn],
            "alerts": list(self.alerts),
            "client_view_events": self.client_view_events,
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class TierResult:
    name: str
    requests: int
    objectives: list[ObjectiveResult]
    performance: Classification

    def to_dict(self) -> dict[str, Any]:
        return {
            "tier": self.name,
            "requests": self.requests,
            "objectives": [result.to_dict() for result in self.objectives],
            "performance": self.performance.to_dict(),
        }


@dataclass(frozen=True)
class EvaluationReport:
    tiers: list[TierResult]
    window_s: float
    now: float
    records: int
    client_view_records: int
    notes: list[str] = field(default_factory=list)

    @property
    def results(self) -> list[ObjectiveResult]:
        return [result for tier in self.tiers for result in tier.objectives]

    @property
    def all_met(self) -> bool:
        return all(result.verdict == "met" for result in self.results)

    @property
    def any_violated(self) -> bool:
        return any(result.verdict == "violated" for result in self.results)

    @property
    def any_insufficient(self) -> bool:
        return any(result.verdict == "insufficient_data" for result in self.results)

    @property
    def view(self) -> str:
        if self.client_view_records == 0:
            return "server"
        return "client" if self.client_view_records == self.records else "mixed"

    def to_dict(self) -> dict[str, Any]:
        return {
            "all_met": self.all_met,
            "window": format_duration(self.window_s),
            "now": self.now,
            "records": self.records,
            "view": self.view,
            "client_view_records": self.client_view_records,
            "tiers": [tier.to_dict() for tier in self.tiers],
            "notes": list(self.notes),
        }


def columns_needed(spec: SLOSpec) -> set[str]:
    """The record columns `evaluate` reads for this spec (ITL gaps only when asked for)."""
    needed = {"timestamp", "e2e_s", "ttft_s", "tpot_s", "output_tokens", *CLIENT_VIEW.values()}
    needed -= {"itl_s", "client_itl_s"}
    for tier in spec.tiers:
        for objective in tier.latency_objectives:
            field_name = CATALOG[objective.sli or ""].record_field or ""
            needed.add(field_name)
            if field_name in CLIENT_VIEW:
                needed.add(CLIENT_VIEW[field_name])
    return needed


def evaluate(
    spec: SLOSpec, records: Sequence[RequestRecord] | RecordColumns, now: float | None = None
) -> EvaluationReport:
    from slo.store.columns import RecordColumns

    columns = records if isinstance(records, RecordColumns) else RecordColumns.from_records(records)
    timestamps = columns.number("timestamp")
    if now is None:
        ends = timestamps + columns.number("e2e_s")
        now = float(ends.max()) if len(columns) else time.time()
    in_window = (timestamps >= now - spec.window_s) & (timestamps <= now)
    notes: list[str] = []
    if not in_window.all():
        notes.append(
            f"{int((~in_window).sum())} records outside the {format_duration(spec.window_s)}"
            " window were left out"
        )
        columns = columns.select(in_window)
    known = np.isin(columns.tier, [tier.name for tier in spec.tiers])
    if not known.all():
        strays = sorted(set(columns.tier[~known].tolist()))
        notes.append(
            f"{int((~known).sum())} records of tiers the spec does not define were left "
            f"out: {', '.join(strays[:5])}"
        )
    client_rows = _client_view_rows(columns)
    tiers = [
        _evaluate_tier(spec, tier, columns.select(columns.tier == tier.name), now)
        for tier in spec.tiers
    ]
    return EvaluationReport(tiers, spec.window_s, now, len(columns), client_rows, notes)


def _client_view_rows(columns: RecordColumns) -> int:
    present = np.zeros(len(columns), dtype=bool)
    for client_name in ("client_ttft_s", "client_e2e_s"):
        if client_name in columns.numbers:
            present |= ~np.isnan(columns.numbers[client_name])
    return int(present.sum())


def _sli_values(columns: RecordColumns, field_name: str) -> tuple[np.ndarray, int]:
    """Per-request values of one SLI, client view where present; and how many used it."""
    server = columns.number(field_name)
    client = columns.numbers.get(CLIENT_VIEW.get(field_name, ""))
    if client is None:
        return server, 0
    from_client = ~np.isnan(client)
    return np.where(from_client, client, server), int(from_client.sum())


def _evaluate_tier(spec: SLOSpec, tier: Tier, columns: RecordColumns, now: float) -> TierResult:
    timestamps = columns.number("timestamp")
    ok = columns.outcome == "ok"
    counted = ~np.isin(columns.outcome, OUTCOMES_EXCLUDED_FROM_AVAILABILITY)
    window_masks = {w: timestamps >= now - w for w in spec.alert_policy.windows_s}
    results: list[ObjectiveResult] = []
    for objective in tier.objectives:
        if objective.kind == "latency":
            result = _latency(spec, tier, objective, columns, ok, window_masks)
        elif objective.kind == "availability":
            result = _ratio(spec, tier.name, objective, counted, ok, window_masks)
        elif objective.kind == "goodput":
            checks = goodput_checks(tier.latency_objectives)
            values = [(check, _sli_values(columns, check.field)[0]) for check in checks]
            good = arithmetic.good_requests(ok, values)
            result = _ratio(spec, tier.name, objective, counted, good, window_masks)
        else:
            result = _throughput(spec, tier.name, objective, columns, ok)
        results.append(result)
    ttft, _ = _sli_values(columns, "ttft_s")
    tpot, _ = _sli_values(columns, "tpot_s")
    throughput = _tokens_per_s(columns, ok)
    performance = classify(_p95(ttft[ok]), _p95(tpot[ok]), throughput)
    return TierResult(tier.name, len(columns), results, performance)


def _p95(values: np.ndarray) -> float | None:
    values = values[~np.isnan(values)]
    return nearest_rank(values, 0.95) if values.size else None


def _latency(
    spec: SLOSpec,
    tier: Tier,
    objective: Objective,
    columns: RecordColumns,
    ok: np.ndarray,
    window_masks: dict[float, np.ndarray],
) -> ObjectiveResult:
    field_name = CATALOG[objective.sli or ""].record_field or ""
    threshold = objective.threshold_s or 0.0
    if field_name in columns.gaps:  # itl: one event per gap of an ok request
        from_client = _has_client_gaps(columns)
        gaps = columns.gaps[CLIENT_VIEW[field_name] if from_client else field_name]
        owners = gaps.owner[ok[gaps.owner]]
        values = gaps.values[ok[gaps.owner]]
        masks = {w: mask[owners] for w, mask in window_masks.items()}
        client_events = values.size if from_client else 0
    else:
        all_values, client_events = _sli_values(columns, field_name)
        has_value = ok & ~np.isnan(all_values)
        values = all_values[has_value]
        masks = {w: mask[has_value] for w, mask in window_masks.items()}
    good_mask = values <= threshold if objective.inclusive else values < threshold
    events, good = int(values.size), int(good_mask.sum())
    observed = nearest_rank(values, objective.target) if events else None
    burn = _burn(spec, objective, ~good_mask, masks)
    return objective_result(spec, tier.name, objective, events, good, burn, observed, client_events)


def _has_client_gaps(columns: RecordColumns) -> bool:
    client = columns.gaps.get("client_itl_s")
    return client is not None and client.values.size > 0


def _ratio(
    spec: SLOSpec,
    tier_name: str,
    objective: Objective,
    counted: np.ndarray,
    good_requests: np.ndarray,
    window_masks: dict[float, np.ndarray],
) -> ObjectiveResult:
    good_mask = good_requests[counted]
    events, good = int(good_mask.size), int(good_mask.sum())
    masks = {w: mask[counted] for w, mask in window_masks.items()}
    burn = _burn(spec, objective, ~good_mask, masks)
    return objective_result(spec, tier_name, objective, events, good, burn)


def _burn(
    spec: SLOSpec, objective: Objective, bad: np.ndarray, masks: dict[float, np.ndarray]
) -> Burn:
    counts = {w: (int(mask.sum()), int((bad & mask).sum())) for w, mask in masks.items()}
    return burn_rates(spec, objective, counts, (int(bad.size), int(bad.sum())))


def decide(
    objective: Objective, events: int, good: int, observed: float | None, min_events: int
) -> Verdict:
    """met / violated / insufficient_data; percentile form by the observed value, ratio by count."""
    if events < min_events or events == 0:
        return "insufficient_data"
    if objective.kind == "latency" and objective.form == "percentile" and observed is not None:
        met = arithmetic.within(observed, objective.threshold_s or 0.0, objective.inclusive)
        return "met" if met else "violated"
    return arithmetic.verdict(good, events, objective.target, min_events)


def objective_result(
    spec: SLOSpec,
    tier: str,
    objective: Objective,
    events: int,
    good: int,
    burn: Burn,
    observed: float | None = None,
    client_events: int = 0,
) -> ObjectiveResult:
    """A latency or ratio objective's result from its counts, as every judge that counts builds
    it (in memory here, in SQL in `slo.check.sql_counts`): the verdict by `decide`."""
    verdict = decide(objective, events, good, observed, spec.min_events)
    client = min(client_events, events)  # the client's view, of at most every event
    return ObjectiveResult(tier, objective, events, good, verdict, observed, None, *burn, client)


def _tokens_per_s(columns: RecordColumns, ok: np.ndarray) -> float | None:
    """Output tokens of ok requests over the span from the first start to the last end."""
    if not ok.any():
        return None
    starts = columns.number("timestamp")[ok]
    span = float((starts + columns.number("e2e_s")[ok]).max() - starts.min())
    tokens = float(np.nansum(columns.number("output_tokens")[ok]))
    return tokens / span if span > 0 else None


def _throughput(
    spec: SLOSpec, tier_name: str, objective: Objective, columns: RecordColumns, ok: np.ndarray
) -> ObjectiveResult:
    rate = _tokens_per_s(columns, ok)
    events = int(ok.sum())
    if rate is None or events < spec.min_events:
        verdict: Verdict = "insufficient_data"
    else:
        met = arithmetic.meets_rate(rate, objective.min_tokens_per_s or 0.0)
        verdict = "met" if met else "violated"
    met = verdict == "met"
    return ObjectiveResult(tier_name, objective, events, events if met else 0, verdict, None, rate)
