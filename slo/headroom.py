"""Per-tier SLO headroom: the signal an autoscaler can target.

For each tier with a TTFT objective, the TTFT a request arriving now would get, over the
objective's threshold:

    predicted_ttft = waiting_ahead / drain_rps + prefill_s
    headroom_ratio = predicted_ttft / ttft_threshold         (1.0: at the objective)

- waiting_ahead: requests waiting in this tier and in every tier served before it (a lower
  `priority` number; tiers of equal priority count too, as a FIFO engine serves them);
- drain_rps: requests the server finished per second over the window, every tier (the rate
  the queue moves), floored at one per window so that a stalled server reads as very late;
- prefill_s: the tier's mean prefill time over the window (0 before any request).

Scale out before the ratio reaches 1: a target of 0.7 leaves 30% of the objective for the
new replica to start. Computed the same way in two places from the same series: in the
server (`middleware.metrics.headroom.HeadroomCollector`, from llm_slo_* it already exports, so the
bundled engine and `slo proxy`, which fills llm_slo_queue_depth from the engine's /metrics,
both have it) and in Prometheus (`promql`, for KEDA and the HPA).
"""

from __future__ import annotations

from dataclasses import dataclass

from slo.sli import CATALOG
from slo.spec import SLOSpec, Tier

GAUGE = CATALOG["ttft_headroom"].metric  # llm_slo_ttft_headroom_ratio
WINDOW_S = 120.0
DEFAULT_TARGET = 0.7


@dataclass(frozen=True, slots=True)
class TierSignal:
    tier: str
    threshold_s: float
    ahead: tuple[str, ...]  # tiers whose waiting requests are served no later than this one's


def ttft_threshold(tier: Tier) -> float | None:
    """The tightest TTFT threshold of the tier's latency objectives (None without one)."""
    thresholds = [o.threshold_s for o in tier.latency_objectives if o.sli == "ttft"]
    return min(t for t in thresholds if t) if any(thresholds) else None


def signals(spec: SLOSpec) -> list[TierSignal]:
    found = []
    for tier in spec.tiers:
        threshold = ttft_threshold(tier)
        if threshold is None:
            continue
        ahead = tuple(t.name for t in spec.tiers if t.priority <= tier.priority)
        found.append(TierSignal(tier.name, threshold, ahead))
    return found


def predicted_ttft(waiting_ahead: float, drain_rps: float, prefill_s: float) -> float:
    floor = 1.0 / WINDOW_S
    return waiting_ahead / max(drain_rps, floor) + max(prefill_s, 0.0)


def headroom_ratio(
    waiting_ahead: float, drain_rps: float, prefill_s: float, threshold_s: float
) -> float:
    return predicted_ttft(waiting_ahead, drain_rps, prefill_s) / threshold_s


def promql(signal: TierSignal, window: str = "2m", by: str = "") -> str:
    """The same ratio over Prometheus series (summed over replicas; `by` keeps a label,
    e.g. "namespace")."""
    queue = CATALOG["queue_depth"].metric
    requests = CATALOG["requests"].metric
    prefill = CATALOG["prefill"].metric
    group = f" by ({by})" if by else ""
    tiers = "|".join(signal.ahead)
    floor = f"{1.0 / WINDOW_S:.6g}"
    return (
        f'((sum{group}(max_over_time({queue}{{tier=~"{tiers}"}}[30s]))'
        f" / clamp_min(sum{group}(rate({requests}[{window}])), {floor}))"
        f' + (sum{group}(rate({prefill}_sum{{tier="{signal.tier}"}}[{window}]))'
        f' / clamp_min(sum{group}(rate({prefill}_count{{tier="{signal.tier}"}}[{window}])), 1e-9)))'
        f" / {signal.threshold_s:g}"
    )
