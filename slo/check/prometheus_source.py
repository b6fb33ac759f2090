"""Evaluate a spec from Prometheus histograms and counters (HTTP API, instant queries).

Every SLO threshold is a bucket boundary (see `slo.sli.buckets_for`), so "how many requests
met 200 ms" is an exact bucket count, not an estimate. The observed percentile is the
histogram estimate (linear inside the bucket, as `histogram_quantile` does), so near the
threshold the verdict follows the counts: the ratio form. Counts come from `increase()`,
which Prometheus extrapolates, hence rounded to whole events; every query is evaluated at the
same instant (the report's `now`), so good and total events come from the same samples.
Goodput's events are availability's, its good events the increase of the good-requests counter
(`llm_slo_good_requests_total`, which the middleware counts per request as `slo check` judges
records); a tier without that series (a middleware that does not export it) is insufficient
data, with a note, rather than all bad.

The judging is the core's, as for every other judge: verdicts, burn rates and burn-rate
alerts from `slo.arithmetic` (through `slo.check.evaluate.burn_rates`), the percentile estimate from
`slo.alert_rules.histogram_quantile` (the in-process copy of Prometheus' own).
"""

from __future__ import annotations

import math
from typing import Any

import httpx

from slo import arithmetic
from slo.alert_rules import histogram_quantile
from slo.check.evaluate import EvaluationReport, ObjectiveResult, TierResult, Verdict, burn_rates
from slo.errors import UsageError
from slo.performance import classify
from slo.sli import CATALOG, OUTCOMES_EXCLUDED_FROM_AVAILABILITY
from slo.spec import SLOSpec, Tier
from slo.spec.objectives import Objective
from slo.units import format_duration

Buckets = list[tuple[float, float]]  # (upper bound, cumulative count), +Inf last
GOOD_REQUESTS = CATALOG["good_requests"].metric


# Where `slo check` finds the CA and the token when no flag names them; the errors name them.
CA_FILE_ENV = "LLM_SLO_PROMETHEUS_CA_FILE"
TOKEN_FILE_ENV = "LLM_SLO_PROMETHEUS_TOKEN_FILE"


class PrometheusReader:
    """Instant queries against Prometheus' HTTP API through `client`, which the front door
    builds (`slo.cli.check.prometheus_reader`: the CA to verify HTTPS against, the bearer token
    of a Prometheus behind an authenticating proxy), so the evaluator reads no file itself."""

    def __init__(self, url: str, client: httpx.Client, at: float | None = None) -> None:
        self.url = url.rstrip("/")
        self.client = client
        # Evaluation time (Unix seconds) of every query; None: each at the server's now.
        self.at = at

    def close(self) -> None:
        self.client.close()

    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        params = {"query": promql}
        if self.at is not None:
            params["time"] = f"{self.at:.3f}"
        try:
            response = self.client.get(f"{self.url}/api/v1/query", params=params)
        except httpx.HTTPError as error:
            raise UsageError(
                f"cannot query Prometheus at {self.url}: {error}; check --prometheus URL "
                f"(and ${CA_FILE_ENV} for a private CA)"
            ) from None
        if response.status_code in (401, 403):
            raise UsageError(
                f"Prometheus at {self.url} answered {response.status_code}: give its bearer "
                f"token in a file named by ${TOKEN_FILE_ENV}"
            )
        try:
            body = response.json()
        except ValueError:
            raise UsageError(
                f"Prometheus at {self.url} answered {response.status_code} with no JSON; "
                "check --prometheus URL"
            ) from None
        if body.get("status") != "success":
            raise UsageError(f"Prometheus at {self.url} refused {promql!r}: {body.get('error')}")
        return [
            (item.get("metric", {}), float(item["value"][1]))
            for item in body.get("data", {}).get("result", [])
        ]

    def buckets(self, metric: str, tier: str, window_s: float) -> Buckets:
        rows = self.query(
            f'sum by (le) (increase({metric}_bucket{{tier="{tier}"}}[{format_duration(window_s)}]))'
        )
        return sorted((float(labels.get("le", "+Inf")), value) for labels, value in rows)

    def by_outcome(self, tier: str, window_s: float) -> dict[str, float]:
        metric = CATALOG["requests"].metric
        rows = self.query(
            f'sum by (outcome) (increase({metric}{{tier="{tier}"}}[{format_duration(window_s)}]))'
        )
        return {labels.get("outcome", ""): value for labels, value in rows}

    def total(self, metric: str, tier: str, window_s: float) -> float:
        found = self.increase(metric, tier, window_s)
        return 0.0 if found is None else found

    def increase(self, metric: str, tier: str, window_s: float) -> float | None:
        """The tier's increase of `metric` over the window; None when it has no series."""
        rows = self.query(f'sum(increase({metric}{{tier="{tier}"}}[{format_duration(window_s)}]))')
        return rows[0][1] if rows else None


def bucket_quantile(buckets: Buckets, target: float) -> float | None:
    """Prometheus' histogram_quantile (the core's copy); None without observations."""
    value = histogram_quantile(target, buckets)
    return None if math.isnan(value) else value


def _good_and_total(buckets: Buckets, objective: Objective, tier: str) -> tuple[int, int]:
    if not buckets:
        return 0, 0
    total = round(buckets[-1][1])
    threshold = objective.threshold_s or 0.0
    for bound, count in buckets:
        if math.isclose(bound, threshold, rel_tol=1e-9):
            return round(count), total
    raise UsageError(
        f"tier {tier!r}: {objective.name}: {threshold:g}s is not a bucket boundary of "
        f"{CATALOG[objective.sli or ''].metric}; build the histogram with slo.sli.buckets_for "
        "and the same spec"
    )


def evaluate_prometheus(
    spec: SLOSpec, reader: PrometheusReader, window_s: float | None = None, now: float = 0.0
) -> EvaluationReport:
    window = window_s or spec.window_s
    if now and reader.at is None:
        reader.at = now  # one instant for every query of the report
    notes = ["counts from Prometheus increase() over the window, rounded to whole events"]
    # Tiers whose goodput Prometheus cannot see: no good-requests series at all.
    blind = {
        tier.name
        for tier in spec.tiers
        if any(o.kind == "goodput" for o in tier.objectives)
        and reader.increase(GOOD_REQUESTS, tier.name, window) is None
    }
    if blind:
        notes.append(
            f"no {GOOD_REQUESTS} series for tier {', '.join(map(repr, sorted(blind)))}: its "
            "goodput is insufficient data (the middleware exports the counter from 0)"
        )
    tiers = [_tier(spec, reader, tier, window, tier.name in blind) for tier in spec.tiers]
    requests = sum(tier.requests for tier in tiers)
    return EvaluationReport(tiers, window, now, requests, 0, notes)


def _tier(
    spec: SLOSpec, reader: PrometheusReader, tier: Tier, window: float, blind: bool
) -> TierResult:
    outcomes = reader.by_outcome(tier.name, window)
    results = [
        ObjectiveResult(tier.name, o, 0, 0, "insufficient_data")
        if blind and o.kind == "goodput"
        else _objective(spec, reader, tier, o, window, outcomes)
        for o in tier.objectives
    ]
    ttft = bucket_quantile(reader.buckets(CATALOG["ttft"].metric, tier.name, window), 0.95)
    tpot = bucket_quantile(reader.buckets(CATALOG["tpot"].metric, tier.name, window), 0.95)
    tokens = reader.total(CATALOG["throughput"].metric, tier.name, window)
    performance = classify(ttft, tpot, tokens / window if tokens else None)
    return TierResult(tier.name, round(sum(outcomes.values())), results, performance)


def _availability_counts(outcomes: dict[str, float]) -> tuple[int, int]:
    counted = sum(v for k, v in outcomes.items() if k not in OUTCOMES_EXCLUDED_FROM_AVAILABILITY)
    return round(outcomes.get("ok", 0.0)), round(counted)


def _objective(
    spec: SLOSpec,
    reader: PrometheusReader,
    tier: Tier,
    objective: Objective,
    window: float,
    outcomes: dict[str, float],
) -> ObjectiveResult:
    if objective.kind == "throughput":
        tokens = reader.total(CATALOG["throughput"].metric, tier.name, window)
        rate = tokens / window
        verdict: Verdict = "insufficient_data"
        if tokens:
            met = arithmetic.meets_rate(rate, objective.min_tokens_per_s or 0.0)
            verdict = "met" if met else "violated"
        return ObjectiveResult(tier.name, objective, 0, 0, verdict, tokens_per_s=rate)

    def counts(window_s: float) -> tuple[int, int, Any]:
        """(good, events, buckets): a latency objective's from its histogram; availability's
        and goodput's events are the counted requests, their good ones the ok requests or the
        good-requests counter's increase."""
        if objective.kind == "latency":
            buckets = reader.buckets(CATALOG[objective.sli or ""].metric, tier.name, window_s)
            return (*_good_and_total(buckets, objective, tier.name), buckets)
        by_outcome = outcomes if window_s == window else reader.by_outcome(tier.name, window_s)
        ok, events = _availability_counts(by_outcome)
        if objective.kind == "goodput":
            return round(reader.total(GOOD_REQUESTS, tier.name, window_s)), events, None
        return ok, events, None

    good, events, buckets = counts(window)
    observed = bucket_quantile(buckets, objective.target) if buckets is not None else None
    by_window = {}
    for window_s in spec.alert_policy.windows_s:
        window_good, window_events, _ = counts(window_s)
        by_window[window_s] = (window_events, window_events - window_good)
    burn, alerts = burn_rates(spec, objective, by_window, (events, events - good))
    # The histogram estimate can sit on either side of the threshold inside its bucket; the
    # exact bucket count decides (for a percentile objective the same verdict: the nearest-rank
    # value is within the threshold iff the required count of events is).
    verdict = arithmetic.verdict(good, events, objective.target, spec.min_events)
    return ObjectiveResult(
        tier.name, objective, events, good, verdict, observed, None, burn, alerts
    )
