"""One step of a capacity search, judged per tier; how many requests a step measures.

A tier passes a step when every per-request objective of its spec is met over the step's
measured window: latency (percentile or ratio form), availability and goodput. A request that
failed or timed out missed its latency objectives too (`slo.check.misses`): a load that answers
fast by failing some requests does not pass. Throughput objectives are left out: they say how
much work was offered, not how much a replica holds.

The measured window's size: a percentile is judged by the requests beyond it, so each tier
gets at least `tail_events` of them at its strictest target q, i.e. tail_events / (1 - q)
requests of that tier (p95 with 10 tail events: 200; p99: 1,000); a tier that is a share s
of the mix needs that over s in total. Fewer tail events judge faster and noisier.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slo import arithmetic
from slo.check.evaluate import CLIENT_VIEW, EvaluationReport, ObjectiveResult
from slo.check.misses import evaluate_counting_failures
from slo.sli import CATALOG, OUTCOMES_EXCLUDED_FROM_AVAILABILITY
from slo.spec import SLOSpec, Tier
from slo.spec.objectives import Objective

PER_REQUEST_KINDS = ("latency", "availability", "goodput")
# The percentiles reported per tier and step (client view where the record has one).
PERCENTILES = {"ttft": (0.50, 0.95, 0.99), "tpot": (0.50, 0.95, 0.99), "e2e": (0.50, 0.95, 0.99)}


def judged_objectives(tier: Tier) -> list[Objective]:
    return [o for o in tier.objectives if o.kind in PER_REQUEST_KINDS]


def measured_requests(
    spec: SLOSpec, mix: Sequence[tuple[str, float]], tail_events: int, minimum: int
) -> int:
    """Requests a step must measure so every tier in the mix has `tail_events` beyond its
    strictest target (see the module docstring)."""
    needed = minimum
    tiers = {tier.name: tier for tier in spec.tiers}
    for name, share in mix:
        tier = tiers.get(name)
        targets = [o.target for o in judged_objectives(tier)] if tier else []
        if not targets or share <= 0:
            continue
        strictest = max(targets)
        per_tier = tail_events / (1.0 - strictest) if strictest < 1 else tail_events * 100
        needed = max(needed, math.ceil(per_tier / share - 1e-9))
    return needed


def severity(result: ObjectiveResult) -> float:
    """How far past its objective a result is: > 1 fails. Percentile form: observed over
    threshold; ratio forms, and a percentile whose rank fell on a failed request (no latency
    observed), the bad share over the allowed bad share (a burn rate)."""
    objective = result.objective
    latency = objective.kind == "latency" and objective.form == "percentile"
    if latency and result.observed_s is not None:
        if not objective.threshold_s:
            return math.inf
        return result.observed_s / objective.threshold_s
    if not result.events:
        return math.inf
    budget = 1.0 - objective.target
    bad = 1.0 - (result.good / result.events)
    return bad / budget if budget > 0 else (math.inf if bad > 0 else 0.0)


@dataclass(frozen=True)
class TierStep:
    """One tier in one step: its verdict, each judged objective, its percentiles."""

    tier: str
    requests: int
    verdict: str  # "pass", "fail" or "no_data"
    objectives: list[dict[str, Any]] = field(default_factory=list)
    percentiles_s: dict[str, float | None] = field(default_factory=dict)

    @property
    def binding(self) -> dict[str, Any] | None:
        """The failed objective furthest past its bound (None when the tier passed)."""
        failed = [o for o in self.objectives if o["verdict"] != "met"]
        return max(failed, key=lambda o: o["severity"]) if failed else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "requests": self.requests,
            "percentiles_s": self.percentiles_s,
            "objectives": self.objectives,
        }


def judge_step(spec: SLOSpec, records: Sequence[Mapping[str, Any]]) -> dict[str, TierStep]:
    """Per tier of the spec that had requests in the step: pass or fail, and why."""
    from slo.check.summary import columns_of, sli_values

    columns = columns_of(records)
    report: EvaluationReport = evaluate_counting_failures(spec, columns)
    steps: dict[str, TierStep] = {}
    for tier, result in zip(spec.tiers, report.tiers, strict=True):
        if result.requests == 0:
            continue
        judged = [r for r in result.objectives if r.objective.kind in PER_REQUEST_KINDS]
        objectives = [_objective_dict(r) for r in judged]
        if any(o["verdict"] == "insufficient_data" for o in objectives):
            verdict = "no_data"
        else:
            verdict = "pass" if all(o["verdict"] == "met" for o in objectives) else "fail"
        rows = columns.select((columns.tier == tier.name) & (columns.outcome == "ok"))
        percentiles: dict[str, float | None] = {}
        for sli, quantiles in PERCENTILES.items():
            values = sli_values(rows, f"{sli}_s")
            values = values[~(values != values)]
            for q in quantiles:
                key = f"{sli}_p{round(q * 100)}"
                percentiles[key] = _rank(sorted(values.tolist()), q)
        steps[tier.name] = TierStep(tier.name, result.requests, verdict, objectives, percentiles)
    return steps


def _rank(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return round(ordered[max(1, math.ceil(q * len(ordered))) - 1], 6)


def _objective_dict(result: ObjectiveResult) -> dict[str, Any]:
    return {
        "objective": result.objective.name,
        "verdict": result.verdict,
        "observed_s": result.observed_s,
        "threshold_s": result.objective.threshold_s,
        "attainment": result.attainment,
        "target": result.objective.target,
        "severity": round(severity(result), 6) if result.events else None,
    }


class ClearMiss:
    """Stops a step as soon as it cannot pass whatever its remaining requests do: some tier's
    objective already has more bad events than its target allows among all the requests of
    that tier the step will measure (an upper bound on its events)."""

    def __init__(self, spec: SLOSpec, planned_per_tier: Mapping[str, int]) -> None:
        self._allowed: dict[tuple[str, int], float] = {}
        self._bad: dict[tuple[str, int], int] = {}
        self._tiers = {tier.name: judged_objectives(tier) for tier in spec.tiers}
        self._checks = {t.name: arithmetic.goodput_checks(t.latency_objectives) for t in spec.tiers}
        for name, objectives in self._tiers.items():
            for index, objective in enumerate(objectives):
                planned = planned_per_tier.get(name, 0)
                self._allowed[(name, index)] = planned * (1.0 - objective.target)
        self.reason: str | None = None
        self.missed: tuple[str, str] | None = None  # (tier, objective) that can no longer pass

    def __call__(self, record: Mapping[str, Any]) -> bool:
        name = str(record.get("tier"))
        ok = record.get("outcome") == "ok"
        for index, objective in enumerate(self._tiers.get(name, ())):
            bad = self._is_bad(name, objective, record, ok)
            if bad:
                key = (name, index)
                self._bad[key] = self._bad.get(key, 0) + 1
                if self._bad[key] > self._allowed[key] + 1e-9:
                    self.reason = f"{name}: {objective.name} can no longer be met"
                    self.missed = (name, objective.name)
                    return True
        return False

    def _is_bad(self, tier: str, objective: Objective, record: Mapping[str, Any], ok: bool) -> bool:
        # A failed request is a bad event of every per-request objective (slo.check.misses);
        # the client's bad request and its walking away are events of none.
        failed = not ok and record.get("outcome") not in OUTCOMES_EXCLUDED_FROM_AVAILABILITY
        if objective.kind == "availability":
            return failed
        if objective.kind == "goodput":
            return failed or (
                ok and not all(c.passes(_value(record, c.field)) for c in self._checks[tier])
            )
        if objective.sli is None:
            return False
        field_name = CATALOG[objective.sli].record_field
        if field_name is None or CATALOG[objective.sli].per_token_gap:
            return False  # ITL counts gaps, not requests: left to the step's verdict
        if not ok:
            return failed
        value = _value(record, field_name)
        if value is None:
            return False
        return not arithmetic.within(value, objective.threshold_s or 0.0, objective.inclusive)


def _value(record: Mapping[str, Any], field_name: str) -> float | None:
    """The client's value where the record has one, else the server's (as `slo check`)."""
    for key in (CLIENT_VIEW.get(field_name), field_name):
        value = record.get(key) if key else None
        if isinstance(value, (int, float)):
            return float(value)
    return None
