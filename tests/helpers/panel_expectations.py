"""What each panel of the generated dashboard must show at `QUERY_AT` for the known traffic
(`tests.helpers.dashboard_traffic`): computed from the records the store kept, the engine's
steps, the GPUs as last read and the cold start, never from the series themselves.

`service_expectations(spec)` here and `ENGINE` in `tests.helpers.engine_expectations` map every
panel title to a function of the traffic giving its expected series, one per target in the
panel's order (`tests.helpers.panel_checks`). A panel with no entry fails the dashboard's value
test: a new panel adds one entry to either table.

Rates are over `$__rate_interval`, four scrapes (RATE_S): a counter's rate is what the requests
that started in the last RATE_S seconds added to it, over RATE_S. The SLO rows read the
recorded windows, each holding the requests its recording rules add up (`covered`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

from alerts.records import labels_of, tile_of
from dashboards.queries import QUANTILES
from dashboards.service_rows import LATENCY_PANELS
from slo.alert_rules import budget_objectives
from slo.arithmetic import good_request, goodput_checks
from slo.check.evaluate import evaluate
from slo.promql import prom_duration
from slo.records import RequestRecord
from slo.sli import (
    LATENCY_FIELDS,
    OUTCOMES,
    OUTCOMES_EXCLUDED_FROM_AVAILABILITY,
    PHASE_FIELDS,
    buckets_for,
)
from slo.spec import SLOSpec
from tests.helpers.dashboard_traffic import QUERY_AT, SCRAPE_S, START, Known
from tests.helpers.panel_checks import Exact, Labels, Quantile, Series, labels

RATE_S = 4.0 * SCRAPE_S  # Grafana's $__rate_interval: four scrape intervals
STEP_S = float(SCRAPE_S)  # the evaluation interval, a subquery's default step
Expectation = Callable[[Known], list[Series]]
_SERVICE_QUANTILES = tuple(float(q) for q in QUANTILES)


@dataclass(frozen=True)
class Window:
    """The requests that started in (start, end]."""

    known: Known
    start: float
    end: float

    @property
    def records(self) -> list[RequestRecord]:
        return self.known.records_in(self.start, self.end)

    @property
    def ok(self) -> list[RequestRecord]:
        return [r for r in self.records if r.outcome == "ok"]


def rate_window(known: Known) -> Window:
    """The last `$__rate_interval` before the panels are read."""
    return Window(known, QUERY_AT - RATE_S, QUERY_AT)


def covered(window_s: float, at: float) -> tuple[float, float]:
    """(start, end] of what a recorded window holds at an evaluation at `at`: a raw window its
    own range, a window of tiles the tiles recorded at the multiples of the tile in it
    (`alerts.burn_model.Counts.window`)."""
    tile = tile_of(window_s)
    if tile is None:
        return at - window_s, at
    return tile * math.ceil((at - window_s) / tile), tile * math.floor(at / tile)


def _error_ratios(known: Known, window_s: float) -> dict[Labels, float]:
    """Bad / events of every objective the rules judge, as `slo check` judges the records."""
    start, end = covered(window_s, QUERY_AT)
    report = evaluate(known.spec, known.records_in(start, end), now=end)
    ratios = {}
    for tier, result in zip(known.spec.tiers, report.tiers, strict=True):
        judged = {objective.name for objective in budget_objectives(tier)}
        for objective in result.objectives:
            if objective.objective.name in judged:
                key = frozenset(labels_of(tier, objective.objective).items())
                ratios[key] = (objective.events - objective.good) / objective.events
    return ratios


def _budgets(known: Known) -> dict[Labels, float]:
    return {
        frozenset(labels_of(tier, o).items()): 1 - o.target
        for tier in known.spec.tiers
        for o in budget_objectives(tier)
    }


def budget_remaining(known: Known) -> list[Series]:
    budgets = _budgets(known)
    ratios = _error_ratios(known, known.spec.window_s)
    return [{key: Exact(1 - ratio / budgets[key]) for key, ratio in ratios.items()}]


def burn_rates(known: Known) -> list[Series]:
    burn = known.spec.alert_policy.burn_rates[0]
    budgets = _budgets(known)
    return [
        {key: Exact(ratio / budgets[key]) for key, ratio in _error_ratios(known, w).items()}
        for w in (burn.long_window_s, burn.short_window_s)
    ]


def _by(
    records: Iterable[RequestRecord], key: Callable[[RequestRecord], Labels]
) -> dict[Labels, list[RequestRecord]]:
    groups: dict[Labels, list[RequestRecord]] = defaultdict(list)
    for record in records:
        groups[key(record)].append(record)
    return groups


def _tier(record: RequestRecord) -> Labels:
    return labels(tier=record.tier)


def _values(records: Iterable[RequestRecord], field: str) -> tuple[float, ...]:
    found: list[float] = []
    for record in records:
        value = getattr(record, field)
        if isinstance(value, list):
            found.extend(value)
        elif value is not None:
            found.append(float(value))
    return tuple(found)


def _quantiles(
    groups: dict[Labels, list[RequestRecord]],
    field: str,
    bounds: tuple[float, ...],
    qs: Iterable[float],
) -> list[Series]:
    return [
        {key: Quantile(q, _values(records, field), bounds) for key, records in groups.items()}
        for q in qs
    ]


def latency_percentiles(sli: str) -> Expectation:
    def expected(known: Known) -> list[Series]:
        groups = _by(rate_window(known).ok, _tier)
        bounds = buckets_for(sli, known.spec)
        series = _quantiles(groups, LATENCY_FIELDS[sli], bounds, _SERVICE_QUANTILES)
        if known.spec.thresholds_for(sli):
            series.append(
                {
                    frozenset(labels_of(tier, o).items()): Exact(o.threshold_s or 0.0)
                    for tier in known.spec.tiers
                    for o in budget_objectives(tier)
                    if o.sli == sli
                }
            )
        return series

    return expected


def _mean(records: list[RequestRecord], field: str, over: str | None = None) -> Exact:
    """Sum of `field` over the records / sum of `over` (None: the records with a `field`)."""
    values = _values(records, field)
    return Exact(sum(values) / (sum(_values(records, over)) if over else len(values)))


def ttft_vs_tpot(known: Known) -> list[Series]:
    groups = _by(rate_window(known).ok, _tier)
    return [
        {key: _mean(records, field) for key, records in groups.items()}
        for field in ("ttft_s", "tpot_s")
    ]


def phase_budget(known: Known) -> list[Series]:
    """Each phase's time per request: a phase no engine reported counts 0 (the phases then add
    up to the mean e2e, as the stacked panel says)."""
    ok = rate_window(known).ok
    return [{labels(): Exact(sum(_values(ok, field)) / len(ok))} for field in PHASE_FIELDS]


def request_size(known: Known) -> list[Series]:
    groups = {labels(): rate_window(known).ok}
    return [
        series
        for name in ("input_tokens", "output_tokens")
        for series in _quantiles(groups, name, buckets_for(name, known.spec), (0.5, 0.95))
    ]


def per_token(known: Known) -> list[Series]:
    groups = _by(rate_window(known).ok, _tier)
    return [
        {key: _mean(records, phase, over) for key, records in groups.items()}
        for phase, over in (("prefill_s", "input_tokens"), ("decode_s", "output_tokens"))
    ]


def request_rate(known: Known) -> list[Series]:
    records = rate_window(known).records
    counts = {outcome: sum(r.outcome == outcome for r in records) for outcome in OUTCOMES}
    return [{labels(outcome=o): Exact(n / RATE_S) for o, n in counts.items()}]


def error_rate(known: Known) -> list[Series]:
    counted = [
        r
        for r in rate_window(known).records
        if r.outcome not in OUTCOMES_EXCLUDED_FROM_AVAILABILITY
    ]
    return [
        {
            key: Exact(sum(r.outcome != "ok" for r in records) / len(records))
            for key, records in _by(counted, _tier).items()
        }
    ]


def goodput(known: Known) -> list[Series]:
    """Good / counted requests per tier, each record decided as `slo check` decides it (its
    tier's goodput checks), then each goodput objective's target."""
    spec = known.spec
    counted = [
        r
        for r in rate_window(known).records
        if r.outcome not in OUTCOMES_EXCLUDED_FROM_AVAILABILITY
    ]

    def good(record: RequestRecord) -> bool:
        checks = goodput_checks(spec.tier(record.tier).latency_objectives)
        return good_request(record.outcome == "ok", checks, partial(getattr, record))

    shares = {
        key: Exact(sum(map(good, records)) / len(records))
        for key, records in _by(counted, _tier).items()
    }
    targets = {
        frozenset(labels_of(tier, o).items()): Exact(o.target)
        for tier in spec.tiers
        for o in budget_objectives(tier)
        if o.kind == "goodput"
    }
    return [shares, targets] if targets else [shares]


def _tokens_per_s(known: Known, end: float) -> float:
    ok = Window(known, end - RATE_S, end).ok
    return sum(r.output_tokens for r in ok) / RATE_S


def throughput(known: Known) -> list[Series]:
    """The rate now, and its highest over the day: every step of the subquery from the first
    scrape on (a window reaching before it counts from the first scrape, at 0)."""
    steps = range(int(START + STEP_S), int(QUERY_AT) + 1, int(STEP_S))
    peak = max(_tokens_per_s(known, at) for at in steps)
    return [{labels(): Exact(_tokens_per_s(known, QUERY_AT))}, {labels(): Exact(peak)}]


def service_expectations(spec: SLOSpec) -> dict[str, Expectation]:
    """The service's rows (`dashboards.service_rows`), by panel title."""
    window = prom_duration(spec.window_s)
    table: dict[str, Expectation] = {
        f"Error budget remaining ({window} window)": budget_remaining,
        "Burn rate per tier": burn_rates,
        "Goodput per tier": goodput,
        "TTFT vs TPOT (mean per request)": ttft_vs_tpot,
        "Latency budget: mean time per phase (stacked)": phase_budget,
        "Request size (tokens)": request_size,
        "Latency by request length (seconds per token)": per_token,
        "Request rate by outcome": request_rate,
        "Error rate per tier": error_rate,
        "Output throughput with capacity baseline": throughput,
    }
    for sli in LATENCY_PANELS:
        table[f"{sli.upper()} percentiles per tier"] = latency_percentiles(sli)
    return table
