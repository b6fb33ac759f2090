"""The window an anomaly signal is read over: 5 minutes, widened at low traffic.

A signal over 5 minutes with too few requests is noise, and a guard that demands
`min_requests` in 5 minutes silences a quiet tier all night: at 0.2 requests/s (60 in 5m), a
prefill that doubles raises nothing until the morning. Instead, per tier and evaluation, the
anomaly window is the narrowest of `WINDOWS_S` (5m, 30m, 1h) that holds at least
`min_requests` requests, recorded in minutes:

    llm_slo_tier:requests:increase5m{tier}     sum(increase(llm_slo_requests_total{tier}[5m]))
    ... increase30m, increase1h                the same over 30m and 1h
    llm_slo_tier:anomaly_window:minutes{tier}  5 + 0 * (increase5m >= min)
                                               or on (tier) 30 + 0 * (increase30m >= min)
                                               or on (tier) 60 + 0 * (increase1h >= min)

and every signal of the tier is the `or` chain of its value over each window, each branch
kept only while that window is the tier's (`and on () window == 30`). At normal traffic the
window is 5m and the signals are exactly what they were before there were wider windows; a
tier with fewer than `min_requests` requests in the last hour has no window, hence no
signal, and raises no anomaly. The phase means over 30m and 1h are recorded for the watched
phases (one rule per window, as the 5m ones are, `alerts.phases`); latency signals read the
bucket rates of their window (`alerts.quantiles`), the request rate its requests record.
"""

from __future__ import annotations

from collections.abc import Callable

from alerts.phases import mean_expr
from alerts.rule_types import REQUESTS, Rule
from slo.alert_rules import PHASE_LABEL
from slo.promql import (
    ANOMALY_WINDOW_RECORD,
    phase_mean_record,
    prom_duration,
    quote,
    requests_record,
    selector,
)

WINDOWS_S: tuple[float, ...] = (300.0, 1800.0, 3600.0)


def minutes(window_s: float) -> int:
    return round(window_s / 60)


def request_records(tier: str) -> list[Rule]:
    """The tier's requests over each window."""
    requests = selector(REQUESTS, tier=tier)
    return [
        Rule(
            f"sum(increase({requests}[{prom_duration(w)}]))",
            record=requests_record(w),
            labels={"tier": tier},
        )
        for w in WINDOWS_S
    ]


def window_rule(tier: str, min_requests: int) -> Rule:
    """The tier's anomaly window in minutes: the narrowest holding `min_requests` requests."""
    branches = [
        f"{minutes(w)} + 0 * ({selector(requests_record(w), tier=tier)} >= {min_requests})"
        for w in WINDOWS_S
    ]
    return Rule(
        "\nor on (tier)\n".join(branches), record=ANOMALY_WINDOW_RECORD, labels={"tier": tier}
    )


def widened(tier: str, over: Callable[[float], str]) -> str:
    """The `or` chain of `over(window)` for each window, each only while it is the tier's."""
    window = selector(ANOMALY_WINDOW_RECORD, tier=tier)
    return "\nor\n".join(f"(\n{over(w)}\n)\nand on ()\n{window} == {minutes(w)}" for w in WINDOWS_S)


def phase_mean_records(tier: str, phases: list[str]) -> list[Rule]:
    """The watched phases' means over the windows wider than 5m, each window one rule."""
    return [
        Rule(
            "\nor\n".join(
                f"label_replace(\n{mean_expr(phase, tier, w)}\n, "
                f'{quote(PHASE_LABEL)}, {quote(phase)}, "", "")'
                for phase in phases
            ),
            record=phase_mean_record(w),
            labels={"tier": tier},
        )
        for w in WINDOWS_S[1:]
    ]
