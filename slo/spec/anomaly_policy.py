"""The anomaly part of the alert policy: info alerts for what has no fixed threshold.

Per tier, each signal of `ANOMALY_SIGNALS` (TTFT, TPOT and e2e p95, the error ratio, the
request rate, every phase's mean) gets a band from its own history (`alerts.anomalies`);
leaving the band for `for_s` raises a `severity: info` alert. A spec opts tiers or signals out:

    alert_policy:
      anomalies:
        min_requests: 100      # a signal is read over the narrowest of 5m, 30m and 1h
                               # holding this many requests; none: no anomaly alert
        sigmas: 3              # band half-width in standard deviations of the history
        min_band: 0.2          # ... and at least this fraction of the band's centre
        for: 5m
        skip:
          - {tier: batch}                  # no anomaly alerts for batch at all
          - {signal: request_rate}         # nor for any tier's request rate
          - {tier: premium, signal: decode_mean}
        # enabled: false       # none at all
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slo.sli import PHASES
from slo.spec.fields import Fail, check_keys, count, duration, line_of, optional_section, positive
from slo.units import format_duration

LATENCY_SIGNALS: tuple[str, ...] = ("ttft_p95", "tpot_p95", "e2e_p95")
ANOMALY_SIGNALS: tuple[str, ...] = (
    *LATENCY_SIGNALS,
    "error_ratio",
    "request_rate",
    *(f"{phase}_mean" for phase in PHASES),
)
_KEYS = ("enabled", "min_requests", "sigmas", "min_band", "for", "skip")
_SKIP_KEYS = ("tier", "signal")


@dataclass(frozen=True, slots=True)
class AnomalyPolicy:
    enabled: bool = True
    min_requests: int = 100
    sigmas: float = 3.0
    min_band: float = 0.2
    for_s: float = 300.0
    skip: tuple[tuple[str | None, str | None], ...] = ()  # (tier, signal); None: any

    def watches(self, tier: str, signal: str) -> bool:
        """Whether the tier's signal gets a band and an info alert."""
        if not self.enabled:
            return False
        return not any(t in (None, tier) and s in (None, signal) for t, s in self.skip)

    def to_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "min_requests": self.min_requests,
            "sigmas": self.sigmas,
            "min_band": self.min_band,
            "for": format_duration(self.for_s),
            "skip": [
                {k: v for k, v in (("tier", t), ("signal", s)) if v is not None}
                for t, s in self.skip
            ],
        }


def build_anomaly_policy(raw: object, line: int, fail: Fail) -> AnomalyPolicy:
    raw = optional_section(
        raw, line, "anomalies", _KEYS, "min_requests, sigmas, min_band, for, skip", fail
    )
    if raw is None:
        return AnomalyPolicy()
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        fail(line_of(raw, "enabled"), f"enabled must be true or false, got {enabled!r}")
    skips = raw.get("skip", [])
    if not isinstance(skips, list):
        fail(line_of(raw, "skip"), "'skip' must be a list of {tier, signal}")
    return AnomalyPolicy(
        enabled=bool(enabled),
        min_requests=count(raw, "min_requests", 100, fail, minimum=1),
        sigmas=positive(raw, "sigmas", fail) if "sigmas" in raw else 3.0,
        min_band=positive(raw, "min_band", fail) if "min_band" in raw else 0.2,
        for_s=duration(raw, "for", 300.0, fail),
        skip=tuple(_skip(item, line_of(skips, i), fail) for i, item in enumerate(skips)),
    )


def _skip(raw: object, line: int, fail: Fail) -> tuple[str | None, str | None]:
    if not isinstance(raw, Mapping) or not set(raw) & set(_SKIP_KEYS):
        fail(line, "a skip entry needs tier, signal or both, e.g. {tier: batch}")
    assert isinstance(raw, Mapping)
    check_keys(raw, _SKIP_KEYS, "anomalies skip", fail)
    signal = raw.get("signal")
    if signal is not None and signal not in ANOMALY_SIGNALS:
        fail(
            line_of(raw, "signal"),
            f"unknown anomaly signal {signal!r}; use one of {', '.join(ANOMALY_SIGNALS)}",
        )
    tier = raw.get("tier")
    return (None if tier is None else str(tier), None if signal is None else str(signal))
