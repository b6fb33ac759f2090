"""Latency quantiles from bucket rates recorded once per tier, SLI and window.

A tier's percentile alerts (p50, p95 and p99 of each latency SLI with an objective) and its
anomaly signals (TTFT, TPOT and e2e p95) all take `histogram_quantile` over
`sum by (tier, le) (rate(<sli>_bucket{tier}[5m]))`: the same rates of every bucket of every
replica, four times over per SLI. Each (SLI, window) is recorded once instead, before the
rules that read it (a rule group evaluates in order, so they read this evaluation's rates):

    llm_slo_tier_le:llm_slo_time_to_first_token_seconds_bucket:rate5m{tier, le}

and `histogram_quantile(q, <record>{tier})` reads the very floats the inline sum gave, so the
quantile, and what fires, are those of the raw expression.
"""

from __future__ import annotations

from alerts.rule_types import Rule
from slo.alert_rules import AlertRule
from slo.promql import number, prom_duration, selector
from slo.sli import CATALOG

LEVEL = "llm_slo_tier_le"


def bucket_rate_record(sli: str, window_s: float) -> str:
    """The record of a latency SLI's bucket rates over the window, per tier and `le`."""
    return f"{LEVEL}:{CATALOG[sli].metric}_bucket:rate{prom_duration(window_s)}"


def quantile_expr(quantile: float, tier: str, sli: str, window_s: float) -> str:
    """`histogram_quantile` of the tier's recorded bucket rates (a series labelled tier)."""
    rates = selector(bucket_rate_record(sli, window_s), tier=tier)
    return f"histogram_quantile({number(quantile)}, {rates})"


def bucket_rate_records(tier: str, needed: set[tuple[str, float]]) -> list[Rule]:
    """One record per (SLI, window) the tier's quantiles read, in a stable order."""
    rules = []
    for sli, window_s in sorted(needed):
        buckets = selector(CATALOG[sli].metric + "_bucket", tier=tier)
        expr = f"sum by (tier, le) (rate({buckets}[{prom_duration(window_s)}]))"
        rules.append(Rule(expr, record=bucket_rate_record(sli, window_s), labels={"tier": tier}))
    return rules


def threshold_quantiles(rules: list[AlertRule], tier: str) -> set[tuple[str, float]]:
    """The (SLI, window) pairs the tier's percentile alerts read."""
    return {
        (rule.sli or "", rule.window_s or 0.0)
        for rule in rules
        if rule.kind == "threshold" and rule.tier == tier
    }
