"""slo.alert_rules.burn_rules: the burn-rate alerts of one objective, built once per spec."""

from __future__ import annotations

import gc

from slo.alert_rules import _BURN_RULES, alert_rules, burn_rules
from slo.spec import SLOSpec

YAML = """
version: 1
tiers:
  - name: premium
    default: true
    objectives: [p95 ttft <= 200ms, availability >= 99.9%]
  - name: batch
    objectives: [p99 e2e <= 20s]
"""


def test_each_objective_gets_exactly_its_burn_rate_rules() -> None:
    spec = SLOSpec.from_yaml(YAML)
    every = alert_rules(spec)
    for tier in spec.tiers:
        for objective in tier.objectives:
            expected = [r for r in every if r.kind == "burn_rate" and r.objective is objective]
            assert expected  # each objective has policy rules, or this proves nothing
            assert list(burn_rules(spec, objective)) == expected


def test_built_once_per_spec_and_dropped_with_it() -> None:
    spec = SLOSpec.from_yaml(YAML)
    objective = spec.tiers[0].objectives[0]
    first = burn_rules(spec, objective)
    entry = _BURN_RULES[id(spec)]
    assert burn_rules(spec, objective) == first
    assert _BURN_RULES[id(spec)] is entry  # the second call reads, it does not rebuild
    other = SLOSpec.from_yaml(YAML)
    assert burn_rules(other, objective) == ()  # an objective of another spec is not its own
    key = id(spec)
    del spec, entry, first, objective
    gc.collect()
    assert key not in _BURN_RULES
