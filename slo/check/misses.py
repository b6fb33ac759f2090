"""A run judged with every failed request a miss: how `slo bench` and its capacity search judge.

`slo check` judges a latency objective over the ok requests that have a value and counts the
failed ones under availability (`slo.check.evaluate`): a service's latency is that of the
answers it gave. A load test asks another question of each request it sent: did it meet its
objective? One that failed or timed out did not. So here a per-request latency objective
(TTFT, TPOT, e2e, ...) counts each failed request as an event that missed: the denominator is
the ok requests with a value plus the failed ones, and in the percentile form a failed request
ranks above every answer (an infinite latency), so "p95 ttft <= 200ms" holds exactly when at
least 95% of those events were answered within 200 ms, as the ratio form says.

Failed: every outcome but ok and those that say nothing about the service
(`OUTCOMES_EXCLUDED_FROM_AVAILABILITY`: the client's bad request, the client walking away).
ITL counts gaps, not requests, and stays as `slo check` judges it; availability and goodput
already count a failed request as bad, throughput has no events to miss. A judged run is not
an alert window: the objectives recounted here carry no burn rates.
"""

from __future__ import annotations

import math

import numpy as np

from slo.check.evaluate import (
    EvaluationReport,
    ObjectiveResult,
    TierResult,
    evaluate,
    nearest_rank,
    objective_result,
)
from slo.check.summary import sli_values
from slo.sli import CATALOG, OUTCOMES_EXCLUDED_FROM_AVAILABILITY
from slo.spec import SLOSpec
from slo.store.columns import RecordColumns

NOT_FAILED = ("ok", *OUTCOMES_EXCLUDED_FROM_AVAILABILITY)


def failed(columns: RecordColumns) -> np.ndarray:
    """Per record: the request failed (server error, timeout, shed, rate limited)."""
    return ~np.isin(columns.outcome, NOT_FAILED)


def counts_failures(result: ObjectiveResult) -> bool:
    """Whether `recount` adds the failed requests to this objective: a per-request latency."""
    objective = result.objective
    if objective.kind != "latency" or not objective.sli:
        return False
    sli = CATALOG[objective.sli]
    return not sli.per_token_gap and sli.record_field is not None


def recount(spec: SLOSpec, result: ObjectiveResult, columns: RecordColumns) -> ObjectiveResult:
    """One tier's objective result with the tier's failed requests (`columns`) as misses."""
    errors = int(failed(columns).sum())
    if not errors or not counts_failures(result):
        return result
    objective = result.objective
    values = sli_values(columns, CATALOG[objective.sli or ""].record_field or "")
    answered = values[(columns.outcome == "ok") & ~np.isnan(values)]
    judged = np.concatenate([answered, np.full(errors, math.inf)])
    observed = nearest_rank(judged, objective.target)
    return objective_result(
        spec,
        result.tier,
        objective,
        result.events + errors,
        result.good,
        ((), ()),
        observed if math.isfinite(observed) else None,  # the rank fell on a failure
        result.client_view_events,
    )


def evaluate_counting_failures(spec: SLOSpec, columns: RecordColumns) -> EvaluationReport:
    """`slo.check.evaluate.evaluate`, each per-request latency objective with its tier's
    failed requests as misses (the module docstring)."""
    report = evaluate(spec, columns)
    timestamps = columns.number("timestamp")
    kept = columns.select((timestamps >= report.now - spec.window_s) & (timestamps <= report.now))
    tiers = []
    for tier in report.tiers:
        rows = kept.select(kept.tier == tier.name)
        results = [recount(spec, result, rows) for result in tier.objectives]
        tiers.append(TierResult(tier.name, tier.requests, results, tier.performance))
    counts = (report.records, report.client_view_records)
    return EvaluationReport(tiers, report.window_s, report.now, *counts, report.notes)
