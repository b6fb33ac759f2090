"""The per-tier, per-objective recording rules: event counts and error ratios per window.

Only windows under 30m (`TILED_FROM_S`; the 5m window by default) read the raw series with
`increase()`, a few samples per replica; every longer window is a sum of recorded tiles, as
Sloth and Pyrra derive their long windows from recorded short ones:

- every evaluation records the last 5 minutes' events and bad events per objective (the 5m
  window, `increase(...[5m])`): the 5-minute tiles;
- a window up to 6h (30m, 1h, 2h, 6h) adds the 5-minute tiles it spans, with a subquery
  stepped by five minutes,

      sum_over_time(llm_slo_tier:objective_events:increase5m{...}[6h - 1s:5m])

  which reads 72 samples per objective where `increase(...[6h])` reads every scrape of every
  replica (28,800 samples at 20 replicas and 15 s scrapes, per series);
- a longer window that is whole hours (1d, 3d, the 30d SLO window) adds the recorded 1h
  window (itself a sum of 5-minute tiles) the same way, stepped by one hour.

The subquery picks the tile recorded at or just before each step, and tiles one step apart
never overlap, so the sum is the count of exactly the window's events up to the last step: a
window of 5-minute tiles ends at most 5 minutes (one tile) before now, one of hourly tiles at
most an hour before. At whole steps, which is where the generated promtool tests and the
judges look, the counts are those of `increase()` over the window. The `- 1s` keeps the range
left-open on both Prometheus 2 (closed ranges) and 3. The price of tiles is Sloth's and
Pyrra's too: events while Prometheus itself was down are in no tile, and on a fresh Prometheus
a window of tiles is empty until its first step has passed. One rule per derived
record covers every objective of the tier (the tiles carry the objective's labels): a cycle's
cost is mostly per rule, not per sample read (tests/benchmarks/test_rule_evaluation_cost.py).
"""

from __future__ import annotations

from alerts.rule_types import GOOD_OUTCOME, GOOD_REQUESTS, REQUESTS, Rule
from slo.alert_rules import AVAILABILITY, GOODPUT, budget_objectives, error_budget
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

FINE_TILE_S = 300.0  # the 5-minute tile: windows up to HOUR_TILES_FROM_S add these
TILE_S = 3600.0  # the hourly tile: longer windows of whole hours add these
TILED_FROM_S = 6 * FINE_TILE_S  # shorter windows read raw series (a few scrapes a replica)
HOUR_TILES_FROM_S = 6 * 3600.0  # windows longer than this add hourly tiles


def tile_of(window_s: float) -> float | None:
    """The tile a window is a sum of (`FINE_TILE_S` or `TILE_S`), None for a raw window: a
    window of whole 5-minute tiles from 30m; whole hours past 6h add hourly tiles. Under 30m a
    window reads raw series: a few scrapes per replica, and no wait for a tile's step on a
    fresh Prometheus."""
    if window_s < TILED_FROM_S:
        return None
    if window_s > HOUR_TILES_FROM_S and round(window_s) % round(TILE_S) == 0:
        return TILE_S
    return FINE_TILE_S if round(window_s) % round(FINE_TILE_S) == 0 else None


def is_derived(window_s: float) -> bool:
    """Whether a window is a sum of recorded tiles rather than an `increase()` of raw series."""
    return tile_of(window_s) is not None


def recorded_windows(windows: set[float] | tuple[float, ...], derive: bool = True) -> set[float]:
    """The windows to record for `windows`: themselves and the tiles they add up (the hourly
    tile is a window of 5-minute tiles)."""
    needed = set(windows)
    while derive:
        tiles = {tile for tile in map(tile_of, needed) if tile is not None} - needed
        if not tiles:
            break
        needed |= tiles
    return needed


def events_expr(tier: str, objective: Objective, window_s: float) -> str:
    """PromQL: the objective's events in the window, summed over models, routes, replicas.
    Goodput counts the requests availability counts."""
    window = prom_duration(window_s)
    if objective.kind in (AVAILABILITY, GOODPUT):
        excluded = matcher("outcome", "!~", any_of(OUTCOMES_EXCLUDED_FROM_AVAILABILITY))
        return f"sum(increase({selector(REQUESTS, excluded, tier=tier)}[{window}]))"
    metric = CATALOG[objective.sli or ""].metric
    return f"sum(increase({selector(metric + '_count', tier=tier)}[{window}]))"


def good_series(tier: str, objective: Objective) -> str:
    """The series a latency or goodput objective's good events are the increase of: the
    histogram bucket at the threshold, or the good-requests counter."""
    if objective.kind == GOODPUT:
        return selector(GOOD_REQUESTS, tier=tier)
    metric = CATALOG[objective.sli or ""].metric
    return selector(metric + "_bucket", le_matcher(objective.threshold_s or 0.0), tier=tier)


def _bad_events(tier: str, objective: Objective, window_s: float, events: str | None = None) -> str:
    """The window's bad events; a latency or goodput objective's are `events` (its PromQL,
    the inline sum unless given) less the good ones. Without a good series (a middleware
    that does not export the good-requests counter) the difference is empty, not all bad."""
    window = prom_duration(window_s)
    if objective.kind == AVAILABILITY:
        bad = matcher("outcome", "!~", any_of((GOOD_OUTCOME, *OUTCOMES_EXCLUDED_FROM_AVAILABILITY)))
        # `or vector(0)`: with no failed request yet the count is 0, not missing.
        return f"(sum(increase({selector(REQUESTS, bad, tier=tier)}[{window}])) or vector(0))"
    good = good_series(tier, objective)
    events = events or events_expr(tier, objective, window_s)
    return f"(\n  {events}\n  -\n  sum(increase({good}[{window}]))\n)"


def error_ratio_expr(tier: str, objective: Objective, window_s: float) -> str:
    """PromQL: bad events / events in the window (a ratio of sums, never a mean of ratios).

    One division, so the ratio is the correctly rounded bad/events and `> limit` against the
    decimal limit is exact (1 - good/events rounds twice).
    """
    return f"{_bad_events(tier, objective, window_s)}\n/\n{events_expr(tier, objective, window_s)}"


def labels_of(tier: Tier, objective: Objective) -> dict[str, str]:
    return {"tier": tier.name, "sli": objective.indicator, "objective": objective.name}


def _derived_records(tier: Tier, window_s: float, ratio: bool) -> list[Rule]:
    """A derived window's records for every objective of the tier at once: each tile series
    (labelled tier, sli, objective) sums to its own window, so one rule per record does what
    one per objective did, with the same series and values."""
    tile_s = tile_of(window_s) or FINE_TILE_S
    span = f"[{prom_duration(window_s - 1)}:{prom_duration(tile_s)}]"
    own = {"tier": tier.name}
    rules = [
        Rule(
            f"sum_over_time({selector(record(tile_s), **own)}{span})", record(window_s), labels=own
        )
        for record in (record_events, record_bad)
    ]
    return rules + ([_ratio_record(tier, window_s)] if ratio else [])


def _window_records(
    tier: Tier,
    objective: Objective,
    window_s: float,
    tile: bool,
    ratio: bool = True,
    counted: Objective | None = None,
) -> list[Rule]:
    """A window read from the raw series. Events first: the bad count and the ratio read that
    record back (the same float the inline sum gives) instead of summing the raw series again,
    twice for a latency ratio. A tile records its bad count too, for the windows that add it,
    and leaves its ratio to `_ratio_record` (one rule for the tier). `counted`: an objective
    recorded before it whose events are the same (goodput's are availability's), whose event
    record it reads instead of the raw series."""
    labels = labels_of(tier, objective)
    events = f"sum({selector(record_events(window_s), **labels)})"
    bad = _bad_events(tier.name, objective, window_s, events)
    raw = events_expr(tier.name, objective, window_s)
    if counted is not None:
        raw = f"sum({selector(record_events(window_s), **labels_of(tier, counted))})"
    rules = [Rule(raw, record_events(window_s))]
    if tile:
        rules.append(Rule(bad, record_bad(window_s)))
    elif ratio:
        rules.append(Rule(f"{bad}\n/\n{events}", record_error_ratio(window_s)))
    return [Rule(r.expr, record=r.record, labels=labels) for r in rules]


def _ratio_record(tier: Tier, window_s: float) -> Rule:
    """The window's error ratio for every objective of the tier from its recorded counts: the
    counts carry `sli` and `objective`, so the division matches each objective's own."""
    own = {"tier": tier.name}
    events, bad = (selector(record_events(window_s), **own), selector(record_bad(window_s), **own))
    return Rule(f"{bad}\n/\n{events}", record=record_error_ratio(window_s), labels=own)


def objective_records(
    tier: Tier,
    windows: set[float] | tuple[float, ...],
    ratios: set[float] | tuple[float, ...] | None = None,
    constants: bool = True,
    tiles: set[float] | frozenset[float] = frozenset(),
    derive: bool = True,
) -> list[Rule]:
    """Per objective: its constants, then each raw window's records (a window in `tiles`, one
    that other windows add up, records its bad count too); then the derived windows, all
    objectives in one rule per record, shortest first (after the tiles they add, so a derived
    window never reads a tile older than the evaluation). A window's error ratio is recorded
    when it is in `ratios` (default: every window). `derive=False` reads raw series over every
    window, as the rules did before tiles (the benchmark's peer)."""
    rules: list[Rule] = []
    ratios = set(windows if ratios is None else ratios)
    derived = sorted(w for w in windows if derive and is_derived(w))
    objectives = budget_objectives(tier)
    first: dict[str, Objective] = {}  # events PromQL -> the first objective counting them
    for objective in objectives:
        counted = first.setdefault(events_expr(tier.name, objective, FINE_TILE_S), objective)
        same = None if counted is objective else counted
        labels = labels_of(tier, objective)
        if constants:
            budget = number(error_budget(objective))
            rules.append(Rule(budget, record=ERROR_BUDGET_RECORD, labels=labels))
            if objective.kind == "latency":
                threshold = number(objective.threshold_s or 0.0)
                rules.append(Rule(threshold, record=THRESHOLD_RECORD, labels=labels))
        for window in sorted(set(windows) - set(derived)):
            tile = derive and window in tiles
            rules.extend(_window_records(tier, objective, window, tile, window in ratios, same))
    raw_tiles = set(windows) - set(derived) if derive and objectives else set()
    rules.extend(_ratio_record(tier, w) for w in sorted(raw_tiles & set(tiles) & ratios))
    for window in derived if objectives else []:
        rules.extend(_derived_records(tier, window, window in ratios))
    return rules
