"""promtool tests of the anomaly bands on a synthetic week: diurnal traffic with noise.

One tier (the spec's first) gets, every minute, a request rate that swings +-50% over the
day with 5% noise, a few server errors, a lognormal TTFT whose median jitters by 3%, and
phase means (network, other, queue growing with load, prefill, decode, detokenize) whose
sum is the mean e2e. Two groups, rules evaluated every 5 minutes:

- normal: a day to warm up, then seven normal days: no `LLMSLOAnomaly` ever fires (the
  `ALERTS` series promtool records holds no firing sample over the eight days);
- regression: a day and two hours of the same traffic, then prefill and TTFT 2x slower: the
  info alert for `ttft_p95` fires within 10 minutes, labelled `phase="prefill"`.

The traffic is drawn from a seeded generator: the same file every run.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from alerts.anomalies import ALERT_NAME, ANOMALY_LABEL
from alerts.rule_types import REQUESTS
from slo.alert_rules import PHASE_LABEL
from slo.promql import le_value, prom_duration
from slo.sli import CATALOG, buckets_for
from slo.spec import SLOSpec

DAY_MIN = 1440
BASE_PER_MIN = 600  # 10 requests/s
TTFT_MEDIAN_S = 0.08
TTFT_SIGMA = 0.3
PHASE_MEANS_S = {
    "network": 0.01,
    "other": 0.01,
    "queue": 0.01,
    "prefill": 0.05,
    "decode": 0.6,
    "detokenize": 0.005,
}
_LABELS = 'model="test-model", route="/v1/completions"'


@dataclass
class Traffic:
    """Counters, one increment per minute, for the tier's series."""

    tier: str
    seed: int
    slow_from: int | None = None  # minute from which prefill and TTFT are 2x slower
    increments: dict[str, list[float]] = field(default_factory=dict)

    def add(self, series: str, value: float) -> None:
        self.increments.setdefault(series, []).append(value)


def _cdf(bound: float, median: float) -> float:
    return 0.5 * (1 + math.erf(math.log(bound / median) / (TTFT_SIGMA * math.sqrt(2))))


def _minute(t: Traffic, spec: SLOSpec, minute: int, rng: random.Random) -> None:
    load = 1 + 0.5 * math.sin(2 * math.pi * minute / DAY_MIN)
    requests = round(BASE_PER_MIN * load * rng.gauss(1, 0.05))
    errors = rng.choice((0, 0, 0, 1))
    slow = 2.0 if t.slow_from is not None and minute >= t.slow_from else 1.0
    base = f'tier="{t.tier}", {_LABELS}'
    t.add(f'{REQUESTS}{{{base}, outcome="ok"}}', requests - errors)
    t.add(f'{REQUESTS}{{{base}, outcome="server_error"}}', errors)
    median = TTFT_MEDIAN_S * slow * rng.gauss(1, 0.03)
    ttft = CATALOG["ttft"].metric
    for bound in buckets_for("ttft", spec):
        t.add(
            f'{ttft}_bucket{{{base}, le="{le_value(bound)}"}}',
            round(requests * _cdf(bound, median)),
        )
    t.add(f'{ttft}_bucket{{{base}, le="+Inf"}}', requests)
    t.add(f"{ttft}_count{{{base}}}", requests)
    means = {phase: mean * rng.gauss(1, 0.03) for phase, mean in PHASE_MEANS_S.items()}
    means["queue"] *= load * load  # waiting grows with load
    means["prefill"] *= slow
    for phase, mean in {**means, "e2e": sum(means.values())}.items():
        metric = CATALOG[phase].metric
        t.add(f"{metric}_sum{{{base}}}", requests * mean)
        t.add(f"{metric}_count{{{base}}}", requests)


def series(spec: SLOSpec, minutes: int, seed: int, slow_from: int | None = None) -> list[Any]:
    """promtool input series: each counter from 0, one sample a minute."""
    traffic = Traffic(spec.tiers[0].name, seed, slow_from)
    rng = random.Random(seed)
    for minute in range(minutes):
        _minute(traffic, spec, minute, rng)
    found = []
    for name, increments in traffic.increments.items():
        total, values = 0.0, ["0"]
        for increment in increments:
            total += increment
            values.append(format(round(total, 6), "g") if total % 1 else str(int(total)))
        found.append({"series": name, "values": " ".join(values)})
    return found


def _firing(labels: dict[str, str]) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{{{inner}}}"


def week_groups(spec: SLOSpec) -> list[dict[str, Any]]:
    tier = spec.tiers[0].name
    firing = f'ALERTS{{alertname="{ALERT_NAME}", alertstate="firing"}}'
    week = 8 * DAY_MIN
    normal = {
        "name": f"{tier}: a normal week of diurnal traffic raises no anomaly",
        "interval": "1m",
        "input_series": series(spec, week, seed=1),
        "alert_rule_test": [],
        "promql_expr_test": [
            {"expr": f"count_over_time({firing}[8d])", "eval_time": "8d", "exp_samples": []}
        ],
    }
    slow_from = DAY_MIN + 120
    check = prom_duration((slow_from + 10) * 60)
    labels = {
        "__name__": "ALERTS",
        "alertname": ALERT_NAME,
        "alertstate": "firing",
        "severity": "info",
        "urgency": "info",
        "tier": tier,
        ANOMALY_LABEL: "ttft_p95",
        PHASE_LABEL: "prefill",
    }
    expected = f"ALERTS{_firing({k: v for k, v in labels.items() if k != '__name__'})}"
    regression = {
        "name": f"{tier}: prefill and TTFT 2x slower raise the ttft_p95 info within 10m",
        "interval": "1m",
        "input_series": series(spec, slow_from + 30, seed=2, slow_from=slow_from),
        "alert_rule_test": [],
        "promql_expr_test": [
            {
                "expr": f"count_over_time({firing}[1d])",
                "eval_time": prom_duration(slow_from * 60),
                "exp_samples": [],
            },
            {
                "expr": f'ALERTS{{alertname="{ALERT_NAME}", alertstate="firing", '
                f'{ANOMALY_LABEL}="ttft_p95"}}',
                "eval_time": check,
                "exp_samples": [{"labels": expected, "value": 1}],
            },
        ],
    }
    return [normal, regression]
