"""What a run looked like, per tier: client percentiles, where the time went, goodput.

Goodput follows `vllm bench serve --goodput` and the spec's goodput objective: a request is
good when it finished ok and meets every per-request latency objective of its tier (ITL is
per gap and stays out; a missing value, such as the TPOT of a one-token reply, passes). The
rate is good requests over the run's duration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from slo import arithmetic
from slo.arithmetic import goodput_checks
from slo.check.evaluate import CLIENT_VIEW, nearest_rank
from slo.sli import PHASES
from slo.spec import SLOSpec
from slo.store.columns import RecordColumns

# The server's phases (slo.sli.PHASES), network last: the part the client view extends.
PHASE_COLUMNS = (*(f"{phase}_s" for phase in PHASES if phase != "network"), "network_s")


def sli_values(columns: RecordColumns, field_name: str) -> np.ndarray:
    """Per request: the client's value where the record has one, else the server's."""
    server = columns.numbers.get(field_name, np.full(len(columns), np.nan))
    client = columns.numbers.get(CLIENT_VIEW.get(field_name, ""))
    if client is None:
        return server
    return np.where(np.isnan(client), server, client)


def good_requests(spec: SLOSpec, columns: RecordColumns) -> np.ndarray:
    """Per record: ok and within every per-request latency objective of its tier."""
    good = columns.outcome == "ok"
    for tier in spec.tiers:
        checks = goodput_checks(tier.latency_objectives)
        values = [(check, sli_values(columns, check.field)) for check in checks]
        good &= (columns.tier != tier.name) | arithmetic.good_requests(good, values)
    return good


@dataclass(frozen=True)
class TierSummary:
    tier: str
    requests: int
    ok: int
    good: int
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    tpot_p95_s: float | None
    e2e_p95_s: float | None
    phase_means_s: dict[str, float]  # server phases, ok requests
    client_network_mean_s: float | None  # client e2e - server e2e: beyond the server's view


def summarize(spec: SLOSpec, columns: RecordColumns) -> list[TierSummary]:
    good = good_requests(spec, columns)
    names = [tier.name for tier in spec.tiers]
    names += sorted(set(columns.tier.tolist()) - set(names))
    summaries = []
    for name in names:
        mask = columns.tier == name
        if not mask.any():
            continue
        ok = mask & (columns.outcome == "ok")
        rows = columns.select(ok)
        beyond = _column(rows, "client_e2e_s") - _column(rows, "e2e_s")
        summaries.append(
            TierSummary(
                name,
                int(mask.sum()),
                int(ok.sum()),
                int((good & mask).sum()),
                _rank(sli_values(rows, "ttft_s"), 0.50),
                _rank(sli_values(rows, "ttft_s"), 0.95),
                _rank(sli_values(rows, "tpot_s"), 0.95),
                _rank(sli_values(rows, "e2e_s"), 0.95),
                {
                    p: float(np.nanmean(v))
                    for p in PHASE_COLUMNS
                    if (v := _column(rows, p)).size and not np.isnan(v).all()
                },
                float(np.nanmean(beyond)) if beyond.size and not np.isnan(beyond).all() else None,
            )
        )
    return summaries


def _column(columns: RecordColumns, name: str) -> np.ndarray:
    return columns.numbers.get(name, np.full(len(columns), np.nan))


def _rank(values: np.ndarray, q: float) -> float | None:
    values = values[~np.isnan(values)]
    return nearest_rank(values, q) if values.size else None


def columns_of(records: Sequence[Mapping[str, Any]]) -> RecordColumns:
    return RecordColumns.from_dicts(list(records))
