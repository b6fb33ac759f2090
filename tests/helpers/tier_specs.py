"""The two-tier spec of the tier-isolation tests and benchmark: premium and a default batch tier."""

from __future__ import annotations


def premium_batch_spec(premium_objectives: str, batch_objectives: str = "p99 e2e <= 30s") -> str:
    """SLO spec YAML: premium (priority 0) and batch (priority 2, the default tier), matched on
    `x-llm-tier`; objectives as the spec writes them, comma-separated."""
    return f"""
version: 1
window: 1h
tiers:
  - name: premium
    priority: 0
    match: {{header: x-llm-tier, values: [premium]}}
    objectives: [{premium_objectives}]
  - name: batch
    priority: 2
    default: true
    match: {{header: x-llm-tier, values: [batch]}}
    objectives: [{batch_objectives}]
"""
