"""The SLO arithmetic, once: verdicts, error budgets, burn rates and goodput.

Every judge calls these functions and none keeps a copy: the evaluator (`slo check`), the live
windows (`/slo` and the in-process alerts), `slo bench`'s summary and the rule generator (which
emits `BURN_RATE_OPERATOR` and the limits computed here). Two copies would disagree at the
boundaries, and an SLO tool whose judges disagree is not trusted.

Exactness. A target is the decimal a person wrote: 99.9% is exactly 999/1000, never
`99.9 / 100 == 0.9990000000000001`. `exact_fraction` recovers that rational from the float the
spec produced (12 significant digits, the same rule as `slo.promql.exact`, far more than anyone
writes), and comparisons are done in integer arithmetic on it: `good * denominator >=
numerator * events`. So 999 good of 1000 meets 99.9% and 998 does not, in every judge.

Fractional counts. Records and the live windows count whole events. Prometheus' `increase()`
extrapolates to the window's edges, so its counts are estimates with fractional parts; they are
compared exactly as given (the exact value of the float, no tolerance). An estimate that lands
near a boundary may fall on either side of it: that is the estimate's error, not the
comparison's, and it is why `slo check --prometheus` is "counts estimated, rule exact".

Burn rate. A burn-rate rule fires when, in every window it looks at, there are at least
`min_events` events and the error ratio is strictly above factor x error budget (`>`, as the SRE
workbook, Sloth and Pyrra write it in PromQL). At exactly factor x budget the budget is spent
exactly as fast as the rule tolerates, which is not yet too fast.

Goodput. A request is good when it finished ok and meets every per-request latency objective of
its tier (ITL is per gap and stays out); a missing value, such as the TPOT of a one-token
reply, passes (`vllm bench serve --goodput`). "Meets" is per request, on the objective's
threshold and operator: `p95 ttft <= 100ms` asks each good request for a TTFT of at most
100 ms, whatever the percentile. Its events are availability's (every request but
client_error and cancelled). `good_requests` decides it over columns of records,
`good_request` for one request as the middleware sees it (its `llm_slo_good_requests_total`
and live windows): the same checks, the same comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from typing import Literal

import numpy as np

from slo.sli import CATALOG
from slo.spec.objectives import Objective

Verdict = Literal["met", "violated", "insufficient_data"]
# Counts: ints from records, whole floats from the live windows, fractional from increase().
Count = int | float
Exact = float | int | Decimal | Fraction

# The comparison of an error ratio with factor x budget, as PromQL spells it. `burning` below is
# the same comparison; the rule generator writes this operator, so both cannot drift apart.
BURN_RATE_OPERATOR = ">"
# The low-traffic guard: a window with at least `min_events` events may alert (`guarded`).
MIN_EVENTS_OPERATOR = ">="


@lru_cache(maxsize=4096)
def exact_fraction(value: Exact) -> Fraction:
    """The rational a person meant: 0.9990000000000001 (99.9 / 100) -> 999/1000."""
    if isinstance(value, Fraction | Decimal | int):
        return Fraction(value)
    return Fraction(format(float(value), ".12g"))


def as_decimal(value: Fraction) -> Decimal:
    """A rational as the decimal rules print (exact for every decimal a spec can hold)."""
    return Decimal(value.numerator) / Decimal(value.denominator)


def error_budget(target: Exact) -> Fraction:
    """The fraction of events allowed to be bad: 1 - target, exactly (99.9% -> 1/1000)."""
    return 1 - exact_fraction(target)


def required_good(target: Exact, events: int) -> int:
    """The fewest good events of `events` that meet `target`: ceil(target x events), exactly."""
    fraction = exact_fraction(target)
    return -(-fraction.numerator * int(events) // fraction.denominator)


def meets(good: Count, events: Count, target: Exact) -> bool:
    """good / events >= target, exactly (see the module docstring for fractional counts)."""
    fraction = exact_fraction(target)
    return Fraction(good) * fraction.denominator >= fraction.numerator * Fraction(events)


def alerts_on_budget(objective: Objective) -> bool:
    """Whether burn-rate alerts (and, for latency, threshold alerts) judge this objective:
    latency, availability and goodput, the objectives Prometheus counts from the exported
    metrics (goodput from the good-requests counter, decided per request by `good_request`).
    Throughput has no error budget: every judge (`slo check`, the live windows, the generated
    rules) leaves its alerts out alike."""
    return objective.kind in ("latency", "availability", "goodput")


def verdict(good: Count, events: Count, target: Exact, min_events: int) -> Verdict:
    """met / violated by count; insufficient_data below `min_events` (or with no events)."""
    if events <= 0 or events < min_events:
        return "insufficient_data"
    return "met" if meets(good, events, target) else "violated"


def attainment(good: Count, events: Count) -> float | None:
    return float(good) / float(events) if events else None


def budget_remaining(good: Count, events: Count, target: Exact) -> float | None:
    """1 = untouched, 0 = spent exactly, negative = overspent; None without events or budget."""
    budget = error_budget(target)
    if not events or budget <= 0:
        return None
    return float(1 - (Fraction(events) - Fraction(good)) / Fraction(events) / budget)


def burn_rate(bad: Count, events: Count, target: Exact) -> float | None:
    """Error ratio / error budget; 1.0 spends the budget exactly over the SLO window."""
    budget = error_budget(target)
    if not events or budget <= 0:
        return None
    return float(Fraction(bad) / Fraction(events) / budget)


def burn_limit(target: Exact, factor: Exact) -> Fraction:
    """The error ratio a burn-rate rule must exceed: factor x error budget, exactly."""
    return exact_fraction(factor) * error_budget(target)


def burning(bad: Count, events: Count, target: Exact, factor: Exact) -> bool:
    """bad / events > factor x budget, strictly and exactly (`BURN_RATE_OPERATOR`)."""
    if events <= 0:
        return False
    limit = burn_limit(target, factor)
    return Fraction(bad) * limit.denominator > limit.numerator * Fraction(events)


def guarded(events: Count, min_events: int) -> bool:
    """Enough traffic in a window to alert (`MIN_EVENTS_OPERATOR`); never without events."""
    return events > 0 and events >= min_events


def rate_guarded(events: Count, window_s: Exact, min_rate: Exact) -> bool:
    """At least `min_rate` events per second over the window (the minimum-request-rate guard)."""
    return Fraction(events) >= exact_fraction(min_rate) * exact_fraction(window_s)


def dynamic_burning(
    bad: Count,
    slo_events: Count,
    window_s: Exact,
    slo_window_s: Exact,
    target: Exact,
    factor: Exact,
) -> bool:
    """Pyrra's dynamic burn rate: more bad events in the window than `factor` x budget of the
    window's share of the SLO window's events (what average traffic would allow), strictly.

    The same absolute count of bad events fires whatever the traffic in the window now.
    """
    if slo_events <= 0:
        return False
    allowed = burn_limit(target, factor) * Fraction(slo_events) * exact_fraction(window_s)
    return Fraction(bad) * exact_fraction(slo_window_s) > allowed


def burn_rule_fires(
    windows: Iterable[tuple[Count, Count]], target: Exact, factor: Exact, min_events: int
) -> bool:
    """A multi-window rule over (bad, events) per window: every window guarded and burning."""
    counted = list(windows)
    return bool(counted) and all(
        guarded(events, min_events) and burning(bad, events, target, factor)
        for bad, events in counted
    )


def meets_rate(tokens_per_s: float, min_tokens_per_s: float) -> bool:
    """A throughput objective: at least the minimum rate (`throughput >= 500 tokens/s`)."""
    return tokens_per_s >= min_tokens_per_s


def within(value: float, threshold_s: float, inclusive: bool) -> bool:
    """One latency value against an objective's threshold (`<=` or `<`); NaN is not within."""
    return value <= threshold_s if inclusive else value < threshold_s


@dataclass(frozen=True, slots=True)
class GoodputCheck:
    """One per-request latency objective a good request must meet, on its record field."""

    field: str  # record field, also the breakdown's attribute: "ttft_s", "e2e_s", ...
    threshold_s: float
    inclusive: bool

    def passes(self, value: float | None) -> bool:
        """A missing value passes (the TPOT of a one-token reply)."""
        return value is None or value != value or within(value, self.threshold_s, self.inclusive)

    def passes_each(self, values: np.ndarray) -> np.ndarray:
        """`passes` over a column (NaN = missing)."""
        with np.errstate(invalid="ignore"):
            inside = values <= self.threshold_s if self.inclusive else values < self.threshold_s
        return np.isnan(values) | inside


def goodput_checks(objectives: Iterable[Objective]) -> tuple[GoodputCheck, ...]:
    """The checks of a tier's goodput: every latency objective on a per-request SLI."""
    checks = []
    for objective in objectives:
        if objective.kind != "latency" or not objective.sli:
            continue
        sli = CATALOG[objective.sli]
        if sli.per_token_gap or sli.record_field is None:
            continue
        checks.append(
            GoodputCheck(sli.record_field, objective.threshold_s or 0.0, objective.inclusive)
        )
    return tuple(checks)


def good_requests(ok: np.ndarray, columns: Iterable[tuple[GoodputCheck, np.ndarray]]) -> np.ndarray:
    """Per request: ok and passing every check, given each check's column of values."""
    good = ok.copy()
    for check, values in columns:
        good &= check.passes_each(values)
    return good


def good_request(
    ok: bool, checks: Iterable[GoodputCheck], value_of: Callable[[str], float | None]
) -> bool:
    """One request: ok and passing every check, `value_of(field)` giving its value of each
    check's record field (None: missing). `good_requests` decides the same over columns."""
    if not ok:
        return False
    # A loop, not all() over a generator (twice its cost): this runs once per request.
    for check in checks:  # noqa: SIM110
        if not check.passes(value_of(check.field)):
            return False
    return True
