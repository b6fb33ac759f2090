"""Live SLOs inside the server: per-tier sliding windows, error budgets, burn rates, alerts.

Counts are kept per tier on the same bucket boundaries as the Prometheus histograms (the spec's
thresholds are boundaries), in fixed-memory rings, one per window the spec and its alert policy
use. Events are counted as `slo check` counts them (see `slo.check.evaluate`): latency objectives
over ok requests with a value (itl over every gap), availability as ok over every request but
client_error and cancelled, goodput as ok requests meeting every per-request latency objective
(the reporter's decision per request, `middleware.request.goodput`, which the good-requests
counter is given too).
With several workers (`PROMETHEUS_MULTIPROC_DIR` set) the rings live in files every worker
reads (`middleware.live.shared`): `/slo` and the alerts judge the whole server's traffic.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np

import middleware.hotpath as hotpath
from middleware.clock import Clock, SystemClock
from middleware.live.alerting import budget_firing, firing_rules, push_to_alertmanager
from middleware.live.shared import PusherElection, SharedWindowSet, shared_dir, window_series
from middleware.live.windows import SLOTS_PER_WINDOW, WindowSet
from middleware.metrics.histograms import BucketCounts, bucket_counts
from middleware.request.breakdown import measured_fields
from middleware.request.goodput import GoodRequests
from middleware.request.timeline import Breakdown
from slo.alert_rules import alert_rules, histogram_quantile, windows_s
from slo.arithmetic import attainment, budget_remaining, burn_rate, verdict
from slo.sli import (
    CATALOG,
    LATENCY_FIELDS,
    OUTCOMES,
    OUTCOMES_EXCLUDED_FROM_AVAILABILITY,
    PER_REQUEST_LATENCY_SLIS,
    PHASE_FIELDS,
    PHASES,
    buckets_for,
)
from slo.spec import SLOSpec, Tier
from slo.spec.objectives import Objective
from slo.units import format_duration

logger = logging.getLogger("middleware.live")


def breakdown_fields(slis: tuple[str, ...]) -> dict[str, str]:
    """SLI -> the `Breakdown` attribute that measures it: its record field (slo.sli.CATALOG).

    Called once at import: a catalog SLI the breakdown does not carry stops the import,
    instead of the live windows (or the histograms) leaving it out without a word.
    """
    carried = set(measured_fields())
    measured = {}
    for name in slis:
        field = LATENCY_FIELDS.get(name)
        if field is None or field not in carried:
            raise TypeError(
                f"slo/sli.py: SLI {name!r} (record field {field!r}) is not measured by "
                f"{Breakdown.__module__}.Breakdown; add a field computed in "
                "RequestTimeline.breakdown, or a function of the timeline's marks to "
                "MEASURED_FROM_MARKS there, so /slo, /metrics and `slo check` all see it"
            )
        measured[name] = field
    return measured


# Latency SLI (one value per request) -> Breakdown attribute, derived from the catalog.
BREAKDOWN_FIELD = breakdown_fields(PER_REQUEST_LATENCY_SLIS)
# The breakdown attribute of each phase (None, an unreported phase, counts as 0 as in
# `Breakdown.phases`).
_phase_values = attrgetter(*PHASE_FIELDS)  # all of them in one call: this runs per request


@dataclass
class _Layout:
    """Where each count lives in a tier's row of columns."""

    outcome_column: dict[str, int]
    goodput_column: int
    histogram_start: dict[str, int]  # sli -> first bucket column (buckets then +Inf)
    phase_start: int  # seconds per phase (PHASES order) summed over ok requests, then their count
    bounds: dict[str, np.ndarray]
    bound_lists: dict[str, list[float]]
    width: int


def _measured_field(tier: Tier, sli: str) -> str:
    """The breakdown field of a latency objective's SLI; one the middleware cannot count
    fails here, at startup, instead of `/slo` judging it on no events while `slo check`
    judges it on the records."""
    field = BREAKDOWN_FIELD.get(sli)
    if field is None:
        raise ValueError(
            f"tier {tier.name!r}: the live windows cannot count SLI {sli!r} (not one of "
            f"{', '.join(BREAKDOWN_FIELD)}); give it a record field that "
            f"{Breakdown.__module__}.Breakdown measures (slo/sli.py), or drop the objective"
        )
    return field


class TierWindows:
    def __init__(
        self, spec: SLOSpec, tier: Tier, windows_s: list[float], shared: Path | None = None
    ) -> None:
        self.tier = tier
        slis = sorted({o.sli for o in tier.objectives if o.kind == "latency" and o.sli})
        column = 0
        outcome_column = {}
        for outcome in OUTCOMES:
            outcome_column[outcome] = column
            column += 1
        goodput_column = column
        column += 1
        # Running sums of each phase, so "where the time goes now" is a division away.
        phase_start = column
        column += len(PHASES) + 1
        starts, bounds = {}, {}
        for sli in slis:
            bounds[sli] = np.asarray(buckets_for(sli, spec), dtype=np.float64)
            starts[sli] = column
            column += len(bounds[sli]) + 1
        self.layout = _Layout(
            outcome_column,
            goodput_column,
            starts,
            phase_start,
            bounds,
            {k: v.tolist() for k, v in bounds.items()},
            column,
        )
        self.windows = (
            WindowSet(windows_s, column)
            if shared is None
            else SharedWindowSet(shared, f"{tier.name}:{self.layout!r}", windows_s, column)
        )
        self.latency_objectives = [o for o in tier.objectives if o.kind == "latency"]
        # What `observe` reads per request, decided once: (breakdown field, first column,
        # bounds) per latency SLI but itl, and the goodput checks (slo.arithmetic).
        self._latency_columns = [
            (_measured_field(tier, sli), start, self.layout.bound_lists[sli])
            for sli, start in starts.items()
            if not CATALOG[sli].per_token_gap
        ]
        self._itl_start = starts.get("itl")
        self._goodput = GoodRequests(spec)
        self._lock = threading.Lock()
        self._pending: list[float] = [0.0] * column  # counts per column since the last flush
        self._pending_since: float | None = None
        # Shared rings are flushed per request: other workers read them, not this one's queue.
        self._flush_every_s = 0.0 if shared else min(windows_s) / SLOTS_PER_WINDOW / 4

    def observe(
        self,
        now_s: float,
        outcome: str,
        breakdown: Breakdown | None,
        itl_counts: BucketCounts | None = None,
        good: bool | None = None,
    ) -> None:
        """Queue one request's counts; they reach the rings in batches (see `_flush`).

        `itl_counts`: the breakdown's gaps already counted on the itl buckets
        (`bucket_counts(buckets_for("itl", spec), gaps)`), shared with the Prometheus histogram.
        `good`: whether it is good for goodput, as the reporter decided
        (`middleware.request.goodput`); by default decided here from `breakdown`.
        """
        layout = self.layout
        if good is None:
            good = self._goodput.good(self.tier.name, outcome, breakdown)
        with self._lock:
            pending = self._pending
            pending[layout.outcome_column[outcome]] += 1
            if good:
                pending[layout.goodput_column] += 1
            if outcome == "ok" and breakdown is not None:
                hotpath.count_in_columns(pending, self._latency_columns, breakdown)
                itl_start = self._itl_start
                if itl_start is not None and breakdown.itl_s:
                    if itl_counts is None:
                        itl_counts = bucket_counts(layout.bound_lists["itl"], breakdown.itl_s)
                    for index, count in itl_counts:
                        pending[itl_start + index] += count
                phase = layout.phase_start
                for value in _phase_values(breakdown):
                    if value:
                        pending[phase] += value
                    phase += 1
                pending[phase] += 1
            since = self._pending_since
            if since is None:
                self._pending_since = since = now_s
        if now_s - since >= self._flush_every_s:
            self._flush(now_s)

    def _flush(self, now_s: float) -> None:
        # Counts queued within a fraction of the finest slot land in the slot of the flush: one
        # numpy update per batch instead of per-request numpy calls on every ring.
        with self._lock:
            if self._pending_since is None:
                return
            pending, self._pending = self._pending, [0.0] * self.layout.width
            self._pending_since = None
            amounts = np.asarray(pending, dtype=np.float64)
            touched = np.nonzero(amounts)[0]
            self.windows.add(now_s, touched, amounts[touched])

    def totals(self, window_s: float, now_s: float) -> np.ndarray:
        self._flush(now_s)
        with self._lock:
            return self.windows.total(window_s, now_s)

    def series(self, window_s: float, now_s: float) -> np.ndarray:
        """Counts per slot of the window ending now, oldest first (60 x columns)."""
        self._flush(now_s)
        with self._lock:
            return window_series(self.windows, window_s, now_s)

    def events_and_good(self, objective: Objective, totals: np.ndarray) -> tuple[float, float]:
        layout = self.layout
        if objective.kind == "latency" and objective.sli in layout.histogram_start:
            start = layout.histogram_start[objective.sli]
            bounds = layout.bounds[objective.sli]
            counts = totals[start : start + len(bounds) + 1]
            # The threshold is a bucket boundary: buckets up to it hold exactly the good events.
            edge = int(np.searchsorted(bounds, objective.threshold_s or 0.0, side="right"))
            return float(counts.sum()), float(counts[:edge].sum())
        counted = sum(
            totals[layout.outcome_column[o]]
            for o in OUTCOMES
            if o not in OUTCOMES_EXCLUDED_FROM_AVAILABILITY
        )
        if objective.kind == "goodput":
            return float(counted), float(totals[layout.goodput_column])
        return float(counted), float(totals[layout.outcome_column["ok"]])

    def cumulative_buckets(self, sli: str, totals: np.ndarray) -> list[tuple[float, float]]:
        """(upper bound, cumulative count) pairs with +Inf last, as Prometheus sees `_bucket`."""
        layout = self.layout
        if sli not in layout.histogram_start:
            return []
        start = layout.histogram_start[sli]
        bounds = layout.bound_lists[sli]
        counts = np.cumsum(totals[start : start + len(bounds) + 1])
        return list(zip([*bounds, math.inf], counts.tolist(), strict=True))

    def quantile(self, sli: str, q: float, totals: np.ndarray) -> float | None:
        cumulative = self.cumulative_buckets(sli, totals)
        value = histogram_quantile(q, cumulative) if cumulative else math.nan
        return None if math.isnan(value) else value


class LiveSLO:
    """Per-tier windows fed by the middleware; `status()` is what `/slo` returns."""

    def __init__(
        self,
        spec: SLOSpec,
        clock: Clock | None = None,
        alertmanager_url: str | None = None,
        evaluation_interval_s: float = 15.0,
    ) -> None:
        self.spec = spec
        self.clock = clock or SystemClock()
        self.windows_s = list(windows_s(spec))
        self.shared_dir = shared_dir()
        self.tiers = {
            tier.name: TierWindows(spec, tier, self.windows_s, self.shared_dir)
            for tier in spec.tiers
        }
        # Every worker computes the alerts (the same `for` state); one pushes them.
        self._election = PusherElection(self.shared_dir)
        self.itl_bounds = buckets_for("itl", spec)  # what `observe`'s itl_counts are counted on
        self.alertmanager_url = alertmanager_url
        self.evaluation_interval_s = evaluation_interval_s
        self._stop = threading.Event()
        self._pending: dict[str, float] = {}
        self.rules = alert_rules(spec)
        self._alerts_lock = threading.Lock()
        self._pusher: threading.Thread | None = None
        self.pushed = 0
        if alertmanager_url:
            self._pusher = threading.Thread(
                target=self._push_loop, name="llm-slo-alert-push", daemon=True
            )
            self._pusher.start()

    def observe(
        self,
        tier: str,
        outcome: str,
        breakdown: Breakdown | None,
        itl_counts: BucketCounts | None = None,
        good: bool | None = None,
    ) -> None:
        """Count one finished request (`breakdown` for ok requests that produced tokens).

        `itl_counts`, when given, are `bucket_counts(self.itl_bounds, breakdown.itl_s)`;
        `good`, the reporter's goodput decision (by default made from `breakdown`).
        """
        self.tiers[tier].observe(self.clock.wall_s(), outcome, breakdown, itl_counts, good)

    def status(self) -> dict[str, Any]:
        now = self.clock.wall_s()
        tiers = []
        for name, windows in self.tiers.items():
            totals = {w: windows.totals(w, now) for w in self.windows_s}
            window_totals = totals[self.spec.window_s]
            objectives = []
            for objective in windows.tier.objectives:
                if not objective.has_error_budget:
                    continue
                events, good = windows.events_and_good(objective, window_totals)
                objectives.append(
                    objective_status(self.spec, windows, objective, events, good, totals)
                )
            requests = int(sum(window_totals[windows.layout.outcome_column[o]] for o in OUTCOMES))
            tiers.append(
                {
                    "tier": name,
                    "priority": windows.tier.priority,
                    "requests": requests,
                    "objectives": objectives,
                }
            )
        alerts = self.firing_alerts(now)
        return {
            "window": format_duration(self.spec.window_s),
            "evaluated_at": now,
            "tiers": tiers,
            "alerts": alerts,
        }

    def firing_alerts(self, now_s: float | None = None) -> list[dict[str, Any]]:
        with self._alerts_lock:
            now = self.clock.wall_s() if now_s is None else now_s
            policy_min_events = self.spec.alert_policy.min_events
            return firing_rules(self.rules, self.tiers, now, self._pending) + budget_firing(
                self.tiers, self.spec.window_s, policy_min_events, now, self._pending
            )

    def _push_loop(self) -> None:
        while not self._stop.wait(self.evaluation_interval_s):
            try:
                alerts = self.firing_alerts()
                if alerts and self.alertmanager_url and self._election.held():
                    push_to_alertmanager(self.alertmanager_url, alerts, self.evaluation_interval_s)
                    self.pushed += len(alerts)
            except Exception:  # Alertmanager down must not hurt the server
                logger.warning(
                    "llm-slo: could not push alerts to %s", self.alertmanager_url, exc_info=True
                )

    def close(self) -> None:
        self._stop.set()
        if self._pusher is not None:
            self._pusher.join(timeout=10)
        self._election.release()


def objective_status(
    spec: SLOSpec,
    windows: TierWindows,
    objective: Objective,
    events: float,
    good: float,
    totals: dict[float, np.ndarray],
) -> dict[str, Any]:
    burn_rates: dict[str, float | None] = {}
    for window in spec.alert_policy.windows_s:
        window_events, window_good = windows.events_and_good(objective, totals[window])
        burn_rates[format_duration(window)] = burn_rate(
            window_events - window_good, window_events, objective.target
        )
    status: dict[str, Any] = {
        "objective": objective.name,
        "kind": objective.kind,
        "target": objective.target,
        "events": events,
        "good": good,
        "attainment": attainment(good, events),
        "error_budget_remaining": budget_remaining(good, events, objective.target),
        "burn_rates": burn_rates,
        "verdict": verdict(good, events, objective.target, spec.min_events),
    }
    if objective.kind == "latency" and objective.sli:
        status["observed"] = windows.quantile(
            objective.sli, objective.target, totals[spec.window_s]
        )
        status["sli"] = CATALOG[objective.sli].name
    return status
