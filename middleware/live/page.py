"""The on-call page: `/slo.html` and the one JSON it refreshes from, `/slo?view=page`.

Everything is computed on request from the live windows that already exist (`middleware.live`):
no thread, no timer and no extra state, so a server nobody looks at pays nothing for the page.
Over time, each window's ring of 60 slots is read back as a time series (`TierWindows.series`):
the time range picker picks the ring, so a range is one of the windows the server keeps.
The SLO arithmetic (attainment, budget, burn rates and their comparison) is `slo.arithmetic`'s;
the page only arranges its answers. `/slo` without `view` keeps its shape: it is the API.
"""

from __future__ import annotations

import json
import math
import os
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import numpy as np

from middleware.live.blame_share import Caused, delay_caused, tier_blame
from middleware.live.burn_table import burn_table
from middleware.live.windows import SLOTS_PER_WINDOW
from slo.alert_rules import histogram_quantile
from slo.arithmetic import attainment, budget_remaining
from slo.sli import CATALOG, PHASES
from slo.units import format_duration, parse_duration

if TYPE_CHECKING:
    from middleware.live import LiveSLO, TierWindows
    from slo.spec.objectives import Objective

# Where the runbooks `slo generate --runbook-url` points its alerts at; links need it.
RUNBOOK_URL_ENV = "LLM_SLO_RUNBOOK_URL"
REFRESH_S = 5
DEFAULT_RANGE_S = 3600.0  # "the last hours": the 1h ring when the spec keeps one
_STATE_ORDER = {"firing": 0, "violated": 1, "insufficient_data": 2, "met": 3}
_ACRONYMS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}


class PageQueryError(ValueError):
    """A query parameter of `/slo` or `/slo.html` that cannot be served; names the fix."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter


def respond(
    live: LiveSLO, as_html: bool, query: str, metrics: Any = None
) -> tuple[int, str, bytes]:
    """(status code, content type, body) of `/slo`, `/slo?view=page` or `/slo.html`."""
    try:
        view, range_s = parse_query(query, live.windows_s, as_html)
    except PageQueryError as error:
        body = {"error": str(error), "parameter": error.parameter}
        return 400, "application/json", json.dumps(body).encode()
    status = live.status()
    if view == "status":
        return 200, "application/json", json.dumps(status, indent=2).encode()
    engine = engine_now(metrics) if metrics is not None else None
    caused = delay_caused(metrics) if metrics is not None else {}
    data = page_data(live, status, range_s, engine, caused)
    if as_html:
        return 200, "text/html; charset=utf-8", render_page(data).encode()
    return 200, "application/json", json.dumps(data, allow_nan=False).encode()


def parse_query(query: str, windows_s: list[float], as_html: bool) -> tuple[str, float]:
    """('status' | 'page', range in seconds) from `view=page&range=1h`."""
    ranges = ", ".join(format_duration(w) for w in windows_s)
    params = dict(parse_qsl(query, keep_blank_values=True))
    for name in params:
        if name not in ("view", "range"):
            raise PageQueryError(
                name,
                f"/slo: unknown query parameter {name!r}; use view=page and "
                f"range=<one of {ranges}>",
            )
    view = "page" if as_html else params.get("view", "status")
    if view not in ("status", "page"):
        raise PageQueryError(
            "view",
            f"/slo: view={view!r} is not a view; use view=page (the page's JSON) or leave it "
            "out (the API)",
        )
    default = DEFAULT_RANGE_S if DEFAULT_RANGE_S in windows_s else min(windows_s)
    text = params.get("range")
    if text is None:
        return view, default
    try:
        range_s = parse_duration(text)
    except ValueError:
        range_s = math.nan
    if range_s not in windows_s:
        raise PageQueryError(
            "range",
            f"/slo: range={text!r} is not a window this server keeps; use one of {ranges}",
        )
    return view, range_s


def engine_now(metrics: Any) -> dict[str, Any] | None:
    """The bundled engine's latest step as its gauges hold it (`MetricSet.observe_engine_step`);
    None when no engine has reported a step (another engine, or none yet)."""
    values: dict[str, float] = {}
    for name in ("running", "batch_size", "kv_usage"):
        for metric in metrics.gauges[name].collect():
            for sample in metric.samples:
                if sample.labels.get("model") == metrics.model:
                    values[name] = sample.value
    if "batch_size" not in values:
        return None
    queue: dict[str, float] = {}
    for metric in metrics.gauges["queue_depth"].collect():
        for sample in metric.samples:
            if sample.labels.get("model") == metrics.model:
                queue[sample.labels["tier"]] = sample.value
    now = {**values, "queue_depth": queue}
    if not metrics.engine.engine_wide:  # the bundled engine's scheduler: what it shed
        now["shed"] = _shed_counts(metrics)
    return now


def _shed_counts(metrics: Any) -> dict[str, dict[str, float]]:
    """Requests the engine's scheduler shed since start, by tier and reason (its counter)."""
    name = CATALOG["shed"].metric
    shed: dict[str, dict[str, float]] = {}
    for metric in metrics.registry.restricted_registry([name]).collect():
        for sample in metric.samples:
            if sample.name == name and sample.labels.get("model") == metrics.model:
                by_reason = shed.setdefault(sample.labels["tier"], {})
                by_reason[sample.labels["reason"]] = sample.value
    return shed


def page_data(
    live: LiveSLO,
    status: dict[str, Any],
    range_s: float,
    engine: dict[str, Any] | None,
    caused: dict[str, Caused] | None = None,
) -> dict[str, Any]:
    """The page's JSON; `caused`: each tier's blamed seconds since start (`delay_caused`)."""
    now = status["evaluated_at"]
    alerts = [_alert(a) for a in status["alerts"]]
    tiers = [
        _tier(live, live.tiers[tier["tier"]], tier, range_s, now, status["alerts"], engine)
        for tier in status["tiers"]
    ]
    for row in tiers:
        objectives = live.tiers[row["tier"]].tier.objectives
        headline = next((o for o in objectives if o.name == row["headline"]), None)
        row["blame"] = tier_blame((caused or {}).get(row["tier"], {}), headline)
    tiers.sort(key=_worst_first)
    overview = [row for tier in tiers for row in tier["objectives"]]
    overview.sort(key=_worst_first)
    policy = live.spec.alert_policy
    return {
        "window": status["window"],
        "evaluated_at": now,
        "range": format_duration(range_s),
        "ranges": [format_duration(w) for w in live.windows_s],
        "slot_s": range_s / SLOTS_PER_WINDOW,
        "refresh_s": REFRESH_S,
        "alerts": sorted(alerts, key=lambda a: (a["severity"] != "critical", a["tier"])),
        "overview": [_overview_row(row) for row in overview],
        "tiers": tiers,
        "policy": [
            {
                "severity": r.severity,
                "long": format_duration(r.long_window_s),
                "short": format_duration(r.short_window_s),
                "factor": r.factor,
            }
            for r in policy.burn_rates
        ],
        "engine": engine,
        "phases": list(PHASES),
    }


def _worst_first(item: dict[str, Any]) -> tuple[bool, float, int]:
    """Firing first, then the least error budget left; no budget known (no events) last."""
    budget = item.get("budget_left")
    return (
        item["state"] != "firing",
        math.inf if budget is None else budget,
        _STATE_ORDER[item["state"]],
    )


def _alert(alert: dict[str, Any]) -> dict[str, Any]:
    labels = alert["labels"]
    base = os.environ.get(RUNBOOK_URL_ENV, "").rstrip("/")
    name = alert["alertname"]
    return {
        "alertname": name,
        "tier": labels.get("tier", ""),
        "objective": labels.get("objective", ""),
        "severity": labels.get("severity", ""),
        "windows": "/".join(
            w for w in (labels.get("long_window"), labels.get("short_window")) if w
        ),
        "summary": alert["annotations"].get("summary", ""),
        "runbook": f"runbooks/{name}.md",
        "runbook_url": f"{base}/{name}.md" if base else None,
    }


def _tier(
    live: LiveSLO,
    windows: TierWindows,
    tier: dict[str, Any],
    range_s: float,
    now: float,
    firing: list[dict[str, Any]],
    engine: dict[str, Any] | None,
) -> dict[str, Any]:
    totals = {w: windows.totals(w, now) for w in live.windows_s}
    slots = windows.series(range_s, now)
    fired = [a["labels"] for a in firing if a["labels"].get("tier") == tier["tier"]]
    by_name = {o.name: o for o in windows.tier.objectives}
    objectives = []
    for status in tier["objectives"]:
        objective = by_name[status["objective"]]
        row = {**status, "tier": tier["tier"], "budget_left": status["error_budget_remaining"]}
        mine = [labels for labels in fired if labels.get("objective") == objective.name]
        row["firing"] = bool(mine)
        row["state"] = "firing" if mine else status["verdict"]
        row["threshold_s"] = objective.threshold_s
        observed = status.get("observed")
        row["observed"] = observed if observed is not None and math.isfinite(observed) else None
        row["observed_text"] = observed_text(objective, status)
        row["fastest_burn"] = _fastest(status["burn_rates"])
        row["burn_table"] = burn_table(live, windows, objective, totals, mine)
        row["series"] = _series(windows, objective, slots)
        objectives.append(row)
    objectives.sort(key=_worst_first)
    worst = objectives[0] if objectives else None
    return {
        "tier": tier["tier"],
        "priority": tier["priority"],
        "requests": tier["requests"],
        "state": worst["state"] if worst else "insufficient_data",
        "budget_left": worst["budget_left"] if worst else None,
        "headline": worst["objective"] if worst else None,
        "objectives": objectives,
        "phases": _phases(live, windows, now),
        "queue_depth": (engine or {}).get("queue_depth", {}).get(tier["tier"]),
        "shed": (engine or {}).get("shed", {}).get(tier["tier"]),
    }


def observed_text(objective: Objective, status: dict[str, Any]) -> str:
    """`p95 TTFT 182 ms / 200 ms`, `availability 99.2% / 99.9%`: observed against the goal."""
    if objective.kind == "latency" and objective.sli:
        sli = _ACRONYMS.get(objective.sli, objective.sli)
        observed = status.get("observed")
        shown = "–" if observed is None else _ms(observed)
        return f"p{objective.percentile:g} {sli} {shown} / {_ms(objective.threshold_s or 0.0)}"
    value = status["attainment"]
    shown = "–" if value is None else f"{value:.2%}"
    return f"{objective.kind} {shown} / {objective.target:.2%}".replace(".00%", "%")


def _ms(seconds: float) -> str:
    if math.isinf(seconds):
        return "∞"
    milliseconds = seconds * 1e3
    return f"{milliseconds:.3g} ms" if milliseconds < 1000 else f"{seconds:.3g} s"


def _fastest(rates: dict[str, float | None]) -> dict[str, Any] | None:
    known = [(rate, window) for window, rate in rates.items() if rate is not None]
    if not known:
        return None
    rate, window = max(known)
    return {"window": window, "rate": rate}


def _series(windows: TierWindows, objective: Objective, slots: np.ndarray) -> dict[str, Any]:
    """Per slot of the range, oldest first: events, the SLI (good / events), the error budget
    left counting from the range's start, and for latency objectives the percentile."""
    events_per_slot, sli, budget, percentile = [], [], [], []
    events_so_far = good_so_far = 0.0
    for counts in slots:
        events, good = windows.events_and_good(objective, counts)
        events_so_far += events
        good_so_far += good
        events_per_slot.append(events)
        sli.append(_round(attainment(good, events)))
        budget.append(_round(budget_remaining(good_so_far, events_so_far, objective.target)))
        if objective.kind == "latency" and objective.sli:
            cumulative = windows.cumulative_buckets(objective.sli, counts)
            value = histogram_quantile(objective.target, cumulative) if events else math.nan
            percentile.append(None if math.isnan(value) or math.isinf(value) else _round(value))
    return {
        "events": events_per_slot,
        "sli": sli,
        "budget": budget,
        "percentile": percentile if percentile else None,
        "sli_name": CATALOG[objective.sli].name if objective.sli else objective.kind,
    }


def _phases(live: LiveSLO, windows: TierWindows, now: float) -> dict[str, Any]:
    """Where the time goes now: the mean of each phase over ok requests in the shortest window."""
    window = min(live.windows_s)
    totals = windows.totals(window, now)
    start = windows.layout.phase_start
    requests = float(totals[start + len(PHASES)])
    means = {
        phase: _round(float(totals[start + i]) / requests) if requests else None
        for i, phase in enumerate(PHASES)
    }
    return {"window": format_duration(window), "requests": int(requests), "mean_s": means}


def _round(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.6g}")


def _overview_row(row: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "tier",
        "objective",
        "kind",
        "state",
        "verdict",
        "observed_text",
        "budget_left",
        "fastest_burn",
        "events",
        "firing",
    )
    return {key: row[key] for key in keys}


def render_page(data: dict[str, Any]) -> str:
    """The page with its first data inlined: it draws at once, then refreshes from the JSON."""
    template = resources.files("middleware.live").joinpath("templates/slo_page.html").read_text()
    # `</` cannot end the script element early once escaped; JSON stays valid.
    inline = json.dumps(data, allow_nan=False).replace("</", "<\\/")
    return template.replace("__SLO_PAGE_DATA__", inline)
