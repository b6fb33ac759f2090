"""What the generated burn-rate tests claim, read from the test groups themselves, for every
tier and objective of every example spec: a page on a fast burn and a ticket, not a page, on a
slow one; every alert resolved once the burn stopped; each factor and long window pinned;
nothing below the minimum traffic. And the model's windows lag as recorded tiles do. That
Prometheus agrees with the claims is promtool's to say (tests/unit/slo/cli/test_generate.py,
tests/unit/alerts/test_burn_rules_broken.py)."""

from __future__ import annotations

import re
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from alerts import promtool_tests
from alerts.burn_model import Counts
from alerts.burn_tests import GROUP_PREFIX, driving_suffixes
from alerts.promtool_tests import burn_timing, check_grid_s, rule_evaluation_s
from alerts.rules import Links
from slo.alert_rules import AlertRule, alert_rules
from slo.promql import number, prom_duration
from slo.spec import SLOSpec

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "slo" / "examples").glob("*.yaml"))
Key = tuple[str, ...]


def _key(alertname: str, labels: dict[str, str]) -> Key:
    return alertname, *(labels[k] for k in ("tier", "objective", "long_window", "short_window"))


def _rule(rule: AlertRule) -> Key:
    return _key(rule.name, rule.labels)


def _expected(groups: list[dict[str, Any]], case: str) -> dict[str, set[Key]]:
    """eval_time -> every burn-rate alert the group of `case` expects then, in time order."""
    (group,) = [g for g in groups if g["name"] == GROUP_PREFIX + case]
    by_time: dict[str, set[Key]] = {}
    for check in group["alert_rule_test"]:
        alerts = by_time.setdefault(check["eval_time"], set())
        alerts.update(_key(check["alertname"], a["exp_labels"]) for a in check["exp_alerts"])
    return by_time


def _seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return float(sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smhd])", duration)))


def _burn_rules(spec: SLOSpec) -> list[AlertRule]:
    return [rule for rule in alert_rules(spec) if rule.kind == "burn_rate"]


def _driving(spec: SLOSpec) -> dict[str, list[AlertRule]]:
    """Group-name suffix -> the burn-rate rules whose objective drives its series in the
    groups of that suffix (goodput beside availability, on the same request counters, drives
    groups of its own: in the others it reads availability's traffic)."""
    rules = _burn_rules(spec)
    suffixes = driving_suffixes(rules, burn_timing(spec))
    by_suffix: dict[str, list[AlertRule]] = {}
    for rule in rules:
        by_suffix.setdefault(suffixes[id(rule.objective)], []).append(rule)
    return by_suffix


@pytest.fixture(scope="module", params=EXAMPLES, ids=[path.stem for path in EXAMPLES])
def generated(request: pytest.FixtureRequest) -> tuple[SLOSpec, list[dict[str, Any]]]:
    spec = SLOSpec.load(request.param)
    return spec, promtool_tests.test_groups(spec, Links())


def test_the_example_specs_have_every_kind_of_objective_and_rule() -> None:
    rules = [rule for path in EXAMPLES for rule in _burn_rules(SLOSpec.load(path))]
    assert {rule.sli for rule in rules} >= {"availability", "goodput", "ttft", "tpot", "e2e"}
    assert {rule.severity for rule in rules} == {"critical", "warning"}


def test_a_fast_burn_pages_a_slow_burn_tickets_and_both_resolve(
    generated: tuple[SLOSpec, list[dict[str, Any]]],
) -> None:
    spec, groups = generated
    burn = prom_duration(check_grid_s(spec))
    grid = rule_evaluation_s(spec)
    for suffix, rules in _driving(spec).items():
        fast = _expected(groups, f"fast burn (all bad) for {burn}, then good{suffix}")
        slow = _expected(groups, f"slow burn for {burn}, then good{suffix}")
        assert {_rule(rule) for rule in rules} <= fast[burn]  # every page and every ticket
        for rule in rules:
            pages = [
                r.factor
                for r in rules
                if r.objective is rule.objective and r.severity == "critical"
            ]
            if rule.severity == "critical":
                assert _rule(rule) not in slow[burn], rule.labels
            elif pages and rule.factor is not None and rule.factor < min(f or 0 for f in pages):
                assert _rule(rule) in slow[burn], rule.labels
        for by_time in (fast, slow):
            *_, last = by_time.values()
            assert not last  # every alert resolved
            for rule in rules:
                # Where it resolves is pinned: firing at one check, gone at the next evaluation.
                checks = [(_seconds(t), _rule(rule) in alerts) for t, alerts in by_time.items()]
                if any(fires for _, fires in checks):
                    assert any(
                        was and not now and later - earlier == grid
                        for (earlier, was), (later, now) in pairwise(checks)
                    ), rule.labels


def test_each_factor_fires_just_above_and_not_at(
    generated: tuple[SLOSpec, list[dict[str, Any]]],
) -> None:
    spec, groups = generated
    burn = prom_duration(check_grid_s(spec))
    for suffix, rules in _driving(spec).items():
        for rule in rules:
            factor = number(rule.factor or 0)
            assert _rule(rule) in _expected(groups, f"just above {factor}x{suffix}")[burn]
            assert _rule(rule) not in _expected(groups, f"at {factor}x{suffix}")[burn]


def test_each_long_window_up_to_6h_lets_go_of_the_busy_step_on_time(
    generated: tuple[SLOSpec, list[dict[str, Any]]],
) -> None:
    spec, groups = generated
    grid = rule_evaluation_s(spec)
    pinned = [rule for rule in _burn_rules(spec) if (rule.long_window_s or 0) <= 6 * 3600]
    assert pinned
    for suffix, rules in _driving(spec).items():
        busy = _expected(groups, f"a busy first step, then a fast burn{suffix}")
        for rule in (rule for rule in rules if rule in pinned):
            long_s = rule.long_window_s or 0.0
            assert _rule(rule) not in busy[prom_duration(long_s)], rule.labels
            assert _rule(rule) in busy[prom_duration(long_s + grid)], rule.labels


def test_nothing_fires_below_the_minimum_traffic(
    generated: tuple[SLOSpec, list[dict[str, Any]]],
) -> None:
    spec, groups = generated
    least = spec.alert_policy.min_events
    assert least > 1 and spec.alert_policy.min_request_rate == 0
    for suffix, rules in _driving(spec).items():
        below = _expected(groups, f"{least - 1} bad events{suffix}")
        assert below and not any(below.values())
        at = _expected(groups, f"{least} bad events{suffix}")[prom_duration(check_grid_s(spec))]
        assert {_rule(rule) for rule in rules} <= at
        if not suffix:  # every objective reads min_events bad events there, and fires
            assert at == {_rule(rule) for rule in _burn_rules(spec)}


def test_windows_lag_as_their_tiles_do() -> None:
    """One event a minute for 3h: a raw window counts up to now, a window of 5-minute tiles
    up to the last 5 minutes, one of hourly tiles up to the last whole hour."""
    counts = Counts((1,) * 180, (0,) * 180, 60.0)
    assert counts.window(300.0, 92 * 60.0) == (0, 5)  # raw: (87m, 92m]
    assert counts.window(7200.0, 90 * 60.0) == (0, 90)  # 5-minute tiles, on a step: (0, 90m]
    assert counts.window(7200.0, 92 * 60.0) == (0, 90)  # between steps: (0, 90m] still
    assert counts.window(86400.0, 119 * 60.0) == (0, 60)  # hourly tiles: (0, 1h]
    assert counts.window(86400.0, 120 * 60.0) == (0, 120)
    assert counts.window(3 * 3600.0, 4 * 3600.0) == (0, 120)  # past the data: (1h, 3h]
