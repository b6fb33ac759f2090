"""Synthetic fleet history for the rule-evaluation benchmark, as OpenMetrics text that
`promtool tsdb create-blocks-from openmetrics` turns into TSDB blocks.

Every replica of every tier is scraped every `scrape_s`: the requests counter (ok and
server_error), the TTFT, TPOT and e2e histograms (every bucket of the spec, count, sum), and
each phase's sum and count, at a steady 2 requests/s per replica and tier. Recorded series
that the rules read over hours and days (the 5-minute and hourly tiles, the anomaly signals
and their daily means, the phase means and shares) are written too, once a minute, as if
Prometheus had been evaluating the rules all along: a benchmark that starts with them empty
would measure a cost no fleet has.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path

from alerts.anomalies import ANOMALY_MEAN_RECORD
from alerts.records import FINE_TILE_S, TILE_S
from slo.alert_rules import AVAILABILITY, budget_objectives
from slo.promql import (
    ANOMALY_SIGNAL_RECORD,
    ANOMALY_WINDOW_RECORD,
    PHASE_MEAN_RECORD,
    PHASE_SHARE_RECORD,
    REQUESTS_5M_RECORD,
    le_value,
    record_bad,
    record_events,
)
from slo.sli import CATALOG, PHASES, buckets_for
from slo.spec import SLOSpec
from slo.spec.anomaly_policy import ANOMALY_SIGNALS

PER_REPLICA_PER_S = 2.0
BAD_SHARE = 0.001
RECORD_STEP_S = 60
_HISTOGRAMS = ("ttft", "tpot", "e2e")
_MEDIAN_S = {"ttft": 0.1, "tpot": 0.02, "e2e": 2.0}


@dataclass(frozen=True)
class Fleet:
    spec: SLOSpec
    days: float
    replicas: int
    scrape_s: int
    end_s: int  # the last sample's time (unix seconds)
    window: tuple[int, int] | None = None  # write only [since, until) (`chunk`)

    @property
    def start_s(self) -> int:
        return self.end_s - int(self.days * 86400)

    def times(self, step_s: int, since_s: int | None = None) -> range:
        return range(max(self.start_s, since_s or self.start_s), self.end_s + 1, step_s)

    def chunk(self, since_s: int, until_s: int) -> Fleet:
        """The same fleet's history, only its samples in [since_s, until_s): counters keep
        counting from the fleet's start, so chunks written one after another join up."""
        return replace(self, window=(since_s, until_s))

    def in_chunk(self, times: range) -> range:
        if self.window is None:
            return times
        since, until = self.window
        first = times.start + max(0, -(-(since - times.start) // times.step)) * times.step
        return range(first, min(times.stop, until), times.step)


def _share_below(bound: float, median: float) -> float:
    return 0.5 * (1 + math.erf(math.log(bound / median) / (0.5 * math.sqrt(2))))


def _counter(fleet: Fleet, name: str, labels: str, per_s: float) -> Iterator[str]:
    start = fleet.start_s
    for t in fleet.in_chunk(fleet.times(fleet.scrape_s)):
        yield f"{name}{{{labels}}} {per_s * (t - start):.6g} {t}\n"


def _raw(fleet: Fleet) -> Iterator[tuple[str, Iterator[str]]]:
    """(family name, its sample lines) for every scraped series."""
    series: dict[str, list[tuple[str, float]]] = {}
    for tier in fleet.spec.tiers:
        for replica in range(fleet.replicas):
            base = f'tier="{tier.name}", model="m", route="/v1/completions", instance="r{replica}"'
            requests = CATALOG["requests"].metric
            for outcome, share in (("ok", 1 - BAD_SHARE), ("server_error", BAD_SHARE)):
                series.setdefault(requests, []).append(
                    (f'{base}, outcome="{outcome}"', PER_REPLICA_PER_S * share)
                )
            for sli in _HISTOGRAMS:
                metric = CATALOG[sli].metric
                for bound in buckets_for(sli, fleet.spec):
                    share = _share_below(bound, _MEDIAN_S[sli])
                    series.setdefault(f"{metric}_bucket", []).append(
                        (f'{base}, le="{le_value(bound)}"', PER_REPLICA_PER_S * share)
                    )
                series.setdefault(f"{metric}_bucket", []).append(
                    (f'{base}, le="+Inf"', PER_REPLICA_PER_S)
                )
            for sli in (*_HISTOGRAMS, *PHASES):
                metric = CATALOG[sli].metric
                series.setdefault(f"{metric}_count", []).append((base, PER_REPLICA_PER_S))
                series.setdefault(f"{metric}_sum", []).append((base, PER_REPLICA_PER_S * 0.05))
    for name, members in series.items():
        yield (
            name,
            (line for labels, per_s in members for line in _counter(fleet, name, labels, per_s)),
        )


def _recorded(fleet: Fleet) -> Iterator[tuple[str, Iterator[str]]]:
    """The recorded series the rules read over days, once a minute."""
    tiles: dict[str, list[tuple[str, float]]] = {
        record(tile): [] for tile in (FINE_TILE_S, TILE_S) for record in (record_events, record_bad)
    }
    anomalies: dict[str, list[tuple[str, float]]] = {
        ANOMALY_SIGNAL_RECORD: [],
        ANOMALY_MEAN_RECORD: [],
        REQUESTS_5M_RECORD: [],  # with the window, the bands' warm-up reads them
        ANOMALY_WINDOW_RECORD: [],
    }
    phases: dict[str, list[tuple[str, float]]] = {PHASE_MEAN_RECORD: [], PHASE_SHARE_RECORD: []}
    for tier in fleet.spec.tiers:
        for objective in budget_objectives(tier):
            sli = objective.sli or AVAILABILITY
            labels = f'tier="{tier.name}", sli="{sli}", objective="{objective.name}"'
            for tile in (FINE_TILE_S, TILE_S):
                per_tile = PER_REPLICA_PER_S * fleet.replicas * tile
                tiles[record_events(tile)].append((labels, per_tile))
                tiles[record_bad(tile)].append((labels, per_tile * BAD_SHARE))
        for signal in ANOMALY_SIGNALS:
            for record in (ANOMALY_SIGNAL_RECORD, ANOMALY_MEAN_RECORD):
                anomalies[record].append((f'tier="{tier.name}", anomaly="{signal}"', 0.1))
        per_5m = PER_REPLICA_PER_S * fleet.replicas * 300
        anomalies[REQUESTS_5M_RECORD].append((f'tier="{tier.name}"', per_5m))
        anomalies[ANOMALY_WINDOW_RECORD].append((f'tier="{tier.name}"', 5.0))
        for phase in PHASES:
            phases[PHASE_MEAN_RECORD].append((f'tier="{tier.name}", phase="{phase}"', 0.05))
            phases[PHASE_SHARE_RECORD].append((f'tier="{tier.name}", phase="{phase}"', 0.1))
    since = {"tiles": None, "anomalies": fleet.end_s - 8 * 86400, "phases": fleet.end_s - 86400}
    groups = [(tiles, since["tiles"]), (anomalies, since["anomalies"])]
    groups.append((phases, since["phases"]))
    for records, start in groups:
        for name, members in records.items():
            times = fleet.in_chunk(fleet.times(RECORD_STEP_S, start))
            yield (
                name,
                (
                    f"{name}{{{labels}}} {value:.6g} {t}\n"
                    for labels, value in members
                    for t in times
                ),
            )


def write_openmetrics(fleet: Fleet, path: Path) -> int:
    """Write the history (a chunk's, for a chunk); returns the number of samples."""
    samples = 0
    with path.open("w") as out:
        for name, lines in chain(_raw(fleet), _recorded(fleet)):  # lazily: lines bind to name
            out.write(f"# TYPE {name} unknown\n")
            for line in lines:
                out.write(line.replace('", ', '",'))  # OpenMetrics: no space between labels
                samples += 1
        out.write("# EOF\n")
    return samples
