"""Traffic for the in-process evaluator (`LiveSLO`): a two-tier spec with a burn-rate page and a
threshold alert, and requests fed to it one by one on a scripted clock, 100 ms apart."""

from __future__ import annotations

from middleware.clock import ScriptedClock
from middleware.live import LiveSLO
from middleware.request.timeline import Breakdown
from tests.helpers.tier_specs import burn_alert, burn_policy, make_tier, spec_yaml, threshold_alert

SPEC = spec_yaml(
    make_tier("premium", "p95 ttft <= 200ms", "availability >= 99%", priority=0),
    make_tier("standard", "p95 ttft <= 500ms", priority=1, default=True),
    alert_policy=burn_policy(
        burn_alert("page", "10m", "1m", 5), min_events=10, thresholds=[threshold_alert(95, 2)]
    ),
)


def breakdown(ttft_s: float) -> Breakdown:
    return Breakdown(
        e2e_s=ttft_s + 0.1,
        ttft_s=ttft_s,
        tpot_s=0.01,
        itl_s=(0.01,),
        network_s=0.001,
        queue_s=0.0,
        prefill_s=ttft_s,
        decode_s=0.09,
        detokenize_s=0.0,
        other_s=0.0,
        output_tokens=2,
    )


def feed(
    live: LiveSLO, clock: ScriptedClock, tier: str, count: int, ttft_s: float, outcome: str = "ok"
) -> None:
    for _ in range(count):
        live.observe(tier, outcome, breakdown(ttft_s) if outcome == "ok" else None)
        clock.advance_ms(100)
