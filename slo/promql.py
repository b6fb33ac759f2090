"""PromQL spelling shared by the generated rules and dashboards: names, numbers, selectors.

Metric names come from the SLI catalog; the names of our recording rules are defined here,
once, so the rules that write them and the dashboard panels that read them cannot drift.
Numbers are printed exactly (`0.001`, never `0.0009999999999999432`): every value goes
through `Decimal` built from at most 12 significant digits of the float the spec produced,
which is far more precision than anyone writes in a spec and hides binary-float noise.
"""

from __future__ import annotations

import re
from decimal import Decimal

# Recording rules follow the Prometheus naming convention level:metric:operations. The level
# is the tier: every recorded series carries the labels tier, sli and objective.
RECORD_LEVEL = "llm_slo_tier"
ERROR_BUDGET_RECORD = f"{RECORD_LEVEL}:objective_error_budget:ratio"
THRESHOLD_RECORD = f"{RECORD_LEVEL}:objective_threshold:seconds"

_DURATION_UNITS: tuple[tuple[str, int], ...] = (
    ("w", 7 * 86400),
    ("d", 86400),
    ("h", 3600),
    ("m", 60),
    ("s", 1),
)


def exact(value: float | int | Decimal) -> Decimal:
    """The decimal a person meant: 99.9 / 100 -> Decimal('0.999'), not 0.9990000000000001."""
    if isinstance(value, Decimal):
        return value
    return Decimal(format(float(value), ".12g"))


def number(value: float | int | Decimal) -> str:
    """Plain decimal text without exponent or trailing zeros: 0.72, 72, 0.0005."""
    text = format(exact(value).normalize(), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def prom_duration(seconds: float) -> str:
    """A Prometheus duration: 300 -> '5m', 86400 -> '1d', 90 -> '90s', 0.5 -> '500ms'."""
    milliseconds = round(seconds * 1000)
    if milliseconds <= 0:
        raise ValueError(f"duration {seconds!r} s must be positive")
    if milliseconds % 1000:
        return f"{milliseconds}ms"
    whole = milliseconds // 1000
    for unit, size in _DURATION_UNITS:
        if whole % size == 0:
            return f"{whole // size}{unit}"
    raise AssertionError("unreachable: every whole number of seconds divides by 1")


def record_error_ratio(window_s: float) -> str:
    """Bad events / all events of one objective over the window (event-weighted)."""
    return f"{RECORD_LEVEL}:objective_errors:ratio_rate{prom_duration(window_s)}"


def record_events(window_s: float) -> str:
    """All events of one objective over the window: the low-traffic guard reads it."""
    return f"{RECORD_LEVEL}:objective_events:increase{prom_duration(window_s)}"


def le_value(bound: float) -> str:
    """The `le` label prometheus_client writes for a bucket bound (Go float formatting)."""
    text = repr(float(bound))
    dot = text.find(".")
    if bound > 0 and dot > 6:  # the same switch to exponent form as prometheus_client
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text


def le_matcher(bound: float) -> str:
    """Match one bucket whatever the Prometheus version: 3.x rewrites le="1.0" as le="1"."""
    text = le_value(bound)
    if text.endswith(".0"):
        return matcher("le", "=~", any_of((text[:-2], text)))
    return matcher("le", "=", text)


def quote(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def matcher(label: str, op: str, value: str) -> str:
    """One label matcher, the value quoted: matcher("outcome", "!~", "ok|shed")."""
    return f"{label}{op}{quote(value)}"


def selector(metric: str, *matchers: str, **equal: str) -> str:
    """`metric{a="x", <matcher>...}`; keyword arguments are equality matchers."""
    parts = [f"{key}={quote(value)}" for key, value in equal.items()]
    parts.extend(matchers)
    return f"{metric}{{{', '.join(parts)}}}" if parts else metric


def any_of(values: tuple[str, ...] | list[str]) -> str:
    """A regex alternative of literal values, for `=~` and `!~` matchers."""
    return "|".join(re.escape(value) for value in values)


def record_bad(window_s: float) -> str:
    """Bad events of one objective over the window: long windows are sums of these."""
    return f"{RECORD_LEVEL}:objective_bad:increase{prom_duration(window_s)}"


# The phase to blame (alerts/phases.py): per tier and phase, the mean now, its baseline, the
# growth between them, the phase's share of the mean e2e, and the phase blamed per SLI.
PHASE_LEVEL = f"{RECORD_LEVEL}_phase"
PHASE_MEAN_RECORD = f"{PHASE_LEVEL}:mean_seconds:rate5m"
PHASE_MEAN_BASELINE_RECORD = f"{PHASE_LEVEL}:mean_seconds:baseline"
PHASE_SHARE_RECORD = f"{PHASE_LEVEL}:e2e_share:ratio5m"
PHASE_SHARE_BASELINE_RECORD = f"{PHASE_LEVEL}:e2e_share:baseline"
PHASE_GROWTH_RECORD = f"{PHASE_LEVEL}:mean_growth:seconds"
BLAMED_PHASE_RECORD = f"{RECORD_LEVEL}:blamed_phase:growth_seconds"
E2E_MEAN_RECORD = f"{RECORD_LEVEL}:e2e_mean_seconds:rate5m"
# Who made the tier wait (alerts/culprits.py): each culprit tier's blamed delay per second, by
# cause, and its share of the delay the engine blamed for the tier's requests, over 5 minutes.
CULPRIT_RATE_RECORD = f"{RECORD_LEVEL}:delay_caused:rate5m"
CULPRIT_SHARE_RECORD = f"{RECORD_LEVEL}:delay_caused:share5m"


# Anomaly bands (alerts/anomalies.py): per tier and signal (label `anomaly`), each signal read
# over the tier's anomaly window (alerts/anomaly_windows.py: 5m, widened at low traffic).
ANOMALY_SIGNAL_RECORD = f"{RECORD_LEVEL}:anomaly_signal:widened"
ANOMALY_WINDOW_RECORD = f"{RECORD_LEVEL}:anomaly_window:minutes"
ANOMALY_CENTER_RECORD = f"{RECORD_LEVEL}:anomaly_band:center"
ANOMALY_WIDTH_RECORD = f"{RECORD_LEVEL}:anomaly_band:half_width"
ANOMALY_UPPER_RECORD = f"{RECORD_LEVEL}:anomaly_band:upper"
ANOMALY_LOWER_RECORD = f"{RECORD_LEVEL}:anomaly_band:lower"


def requests_record(window_s: float) -> str:
    """A tier's requests over the window (the anomaly windows' count guards)."""
    return f"{RECORD_LEVEL}:requests:increase{prom_duration(window_s)}"


def phase_mean_record(window_s: float) -> str:
    """A tier's phase means over the window (5m: the phase to blame's; longer: anomalies')."""
    return f"{PHASE_LEVEL}:mean_seconds:rate{prom_duration(window_s)}"


REQUESTS_5M_RECORD = requests_record(300.0)
