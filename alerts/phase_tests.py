"""promtool tests that the phase to blame is the phase that grew: for the first tier with a
TTFT objective, one group per case of healthy traffic followed by one phase slowing down:

    healthy, every phase at its usual mean ...... | one phase slower (prefill 2x, queue 5x)
    0                                             S                           T (a whole hour)

Means are fractions of the TTFT threshold, so TTFT sits below it (85%) before S and above it
after, and the TTFT burn-rate alerts the arithmetic expects at T (`policy_tests.firing` on
the same counts) must fire with `phase` set to the slowed phase, and the `phase` annotation
must give its share of the mean e2e now and before, as Alertmanager will show them. S lies
50 minutes before T: most of the 1h window is bad, and the baseline hour (2h to 1h before
T) is still healthy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from alerts.culprits import NOBODY
from alerts.policy_tests import Traffic, firing, histogram_series
from alerts.rules import Links, shown_annotations
from slo.alert_rules import AlertRule, alert_rules
from slo.promql import prom_duration
from slo.sli import BEFORE_FIRST_TOKEN, CATALOG, buckets_for
from slo.spec import SLOSpec

REQUESTS_PER_STEP = 100
_MODEL = "test-model"
_ROUTE = "/v1/completions"
# Usual means as fractions of the TTFT threshold; the phases before the first token add to TTFT.
USUAL: dict[str, float] = {
    "network": 0.1,
    "other": 0.1,
    "queue": 0.15,
    "prefill": 0.5,
    "decode": 2.0,
    "detokenize": 0.05,
}
SLOWDOWNS: tuple[tuple[str, float], ...] = (("prefill", 2.0), ("queue", 5.0))
SLOW_FOR_S = 3000.0
# The queue case is a flood of another tier: the engine blames most of the tier's queue time
# on it (seconds per step, by culprit: the flood's tier, the tier itself, nobody), and the page
# names it. The prefill case has no blame (any engine but the bundled one): the page says so.
FLOODED = "queue"
FLOOD_BLAME = (0.9, 0.06, 0.04)


@dataclass(frozen=True)
class PhaseCase:
    phase: str
    factor: float
    means: tuple[dict[str, float], dict[str, float]]  # seconds, before and after S

    def share(self, after: bool) -> float:
        means = self.means[after]
        return means[self.phase] / sum(means.values())


def _case(phase: str, factor: float, threshold: float) -> PhaseCase:
    before = {name: share * threshold for name, share in USUAL.items()}
    after = {**before, phase: before[phase] * factor}
    return PhaseCase(phase, factor, (before, after))


def _sum_count(metric: str, tier: str, means: list[float]) -> list[dict[str, str]]:
    labels = f'tier="{tier}", model="{_MODEL}", route="{_ROUTE}"'
    sums, total = ["0"], 0.0
    for mean in means:
        total += mean * REQUESTS_PER_STEP
        sums.append(repr(round(total, 9)))
    count = f"0+{REQUESTS_PER_STEP}x{len(means)}"
    return [
        {"series": f"{metric}_sum{{{labels}}}", "values": " ".join(sums)},
        {"series": f"{metric}_count{{{labels}}}", "values": count},
    ]


def _series(case: PhaseCase, spec: SLOSpec, tier: str, steps: int, slow_from: int) -> list[Any]:
    means = [case.means[step >= slow_from] for step in range(steps)]
    series: list[Any] = []
    for phase in USUAL:
        series += _sum_count(CATALOG[phase].metric, tier, [m[phase] for m in means])
    series += _sum_count(CATALOG["e2e"].metric, tier, [sum(m.values()) for m in means])
    ttft = [[sum(m.get(p, 0.0) for p in BEFORE_FIRST_TOKEN)] * REQUESTS_PER_STEP for m in means]
    series += histogram_series(CATALOG["ttft"].metric, tier, buckets_for("ttft", spec), ttft)
    if case.phase == FLOODED:
        for culprit, seconds in flood_blame(spec, tier).items():
            labels = f'tier="{tier}", model="{_MODEL}", culprit_tier="{culprit}", cause="queue"'
            series.append(
                {
                    "series": f"{CATALOG['delay_caused'].metric}{{{labels}}}",
                    "values": f"0+{seconds!r}x{steps}",
                }
            )
    return series


def flood_blame(spec: SLOSpec, tier: str) -> dict[str, float]:
    """The queue seconds per step the engine blames, by culprit tier: the flood's (the last
    other tier of the spec), the tier's own, nobody's; a one-tier spec floods itself."""
    others = [t.name for t in spec.tiers if t.name != tier]
    if not others:
        return {tier: FLOOD_BLAME[0] + FLOOD_BLAME[1], NOBODY: FLOOD_BLAME[2]}
    return dict(zip((others[-1], tier, NOBODY), FLOOD_BLAME, strict=True))


def _culprit(case: PhaseCase, spec: SLOSpec, tier: str) -> tuple[str, str, float] | None:
    """What the page names in the flooded case: the culprit tier, its cause, its share."""
    if case.phase != FLOODED:
        return None
    blame = flood_blame(spec, tier)
    culprit = max((t for t in blame if t != NOBODY), key=blame.__getitem__)
    return culprit, "queue", blame[culprit] / sum(blame.values())


def phase_groups(
    spec: SLOSpec, rules: list[AlertRule], links: Links, sample_s: float, grid_s: float
) -> list[dict[str, Any]]:
    """One promtool test group per slowdown, for the first tier with a TTFT burn-rate rule."""
    burn = [r for r in rules if r.kind == "burn_rate" and r.sli == "ttft"]
    if not burn:
        return []
    tier = burn[0].tier or ""
    burn = [r for r in burn if r.tier == tier]
    objective = burn[0].objective
    assert objective is not None and objective.threshold_s is not None
    check_s = grid_s * math.ceil(2 * 3600 / grid_s)
    steps = round(check_s / sample_s)
    slow_from = steps - round(SLOW_FOR_S / sample_s)
    groups = []
    for phase, factor in SLOWDOWNS:
        case = _case(phase, factor, objective.threshold_s)
        ttft_after = sum(case.means[True].get(p, 0.0) for p in BEFORE_FIRST_TOKEN)
        assert ttft_after > objective.threshold_s  # the slowdown must breach, or proves nothing
        bad = tuple(REQUESTS_PER_STEP if k >= slow_from else 0 for k in range(steps))
        good = tuple(REQUESTS_PER_STEP - b for b in bad)
        fired = [
            r for r in firing(burn, Traffic(good, bad), steps, sample_s) if r.objective == objective
        ]
        shares = (case.share(True), case.share(False))
        groups.append(
            {
                "name": f"{tier} {phase} {factor:g}x slower: phase={phase}",
                "interval": prom_duration(sample_s),
                "input_series": _series(case, spec, tier, steps + 1, slow_from),
                "alert_rule_test": [
                    {
                        "eval_time": prom_duration(check_s),
                        "alertname": burn[0].name,
                        "exp_alerts": [
                            {
                                "exp_labels": r.labels_with_phase(phase),
                                "exp_annotations": shown_annotations(
                                    r, spec, links, phase, shares, _culprit(case, spec, tier)
                                ),
                            }
                            for r in fired
                        ],
                    }
                ],
            }
        )
    return groups


def example_alert(spec: SLOSpec, links: Links) -> str:
    """The first TTFT page of the flooded case (the queue slower, another tier to blame), as
    Alertmanager shows it (YAML-ish text): the README's example, which the generated promtool
    test proves Prometheus sends."""
    rules = [r for r in alert_rules(spec) if r.kind == "burn_rate" and r.sli == "ttft"]
    rule = rules[0]
    assert rule.objective is not None and rule.objective.threshold_s is not None
    phase, factor = next(slowdown for slowdown in SLOWDOWNS if slowdown[0] == FLOODED)
    case = _case(phase, factor, rule.objective.threshold_s)
    shares = (case.share(True), case.share(False))
    culprit = _culprit(case, spec, rule.tier or "")
    lines = ["labels:", f"  alertname: {rule.name}"]
    lines += [f"  {key}: {value}" for key, value in rule.labels_with_phase(phase).items()]
    lines.append("annotations:")
    annotations = shown_annotations(rule, spec, links, phase, shares, culprit)
    lines += [f"  {key}: {value}" for key, value in annotations.items()]
    return "\n".join(lines)
