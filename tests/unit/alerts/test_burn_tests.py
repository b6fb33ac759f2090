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
from alerts.burn_tests import GROUP_PREFIX
from alerts.promtool_tests import check_grid_s, rule_evaluation_s
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


@pytest.fixture(scope="module", params=EXAMPLES, ids=[path.stem for path in EXAMPLES])
def generated(request: pytest.FixtureRequest) -> tuple[SLOSpec, list[dict[str, Any]]]:
    spec = SLOSpec.load(request.param)
    return spec, promtool_tests.test_groups(spec, Links())


def test_the_example_specs_have_every_kind_of_objective_and_rule() -> None:
    rules = [rule for path in EXAMPLES for rule in _burn_rules(SLOSpec.load(path))]
    assert {rule.sli for rule in rules} >= {"availability", "ttft", "tpot", "e2e"}
    assert {rule.severity for rule in rules} == {"critical", "warning"}


def test_a_fast_burn_pages_a_slow_burn_tickets_and_both_resolve(
    generated: tuple[SLOSpec, list[dict[str, Any]]],
) -> None:
    spec, groups = generated
    burn = prom_duration(check_grid_s(spec))
    fast = _expected(groups, f"fast burn (all bad) for {burn}, then good")
    slow = _expected(groups, f"slow burn for {burn}, then good")
    rules = _burn_rules(spec)
    assert {_rule(rule) for rule in rules} <= fast[burn]  # every page and every ticket
    for rule in rules:
        pages = [
            r.factor for r in rules if r.objective is rule.objective and r.severity == "critical"
        ]
        if rule.severity == "critical":
            assert _rule(rule) not in slow[burn], rule.labels
        elif pages and rule.factor is not None and rule.factor < min(f or 0 for f in pages):
            assert _rule(rule) in slow[burn], rule.labels
    grid = rule_evaluation_s(spec)
    for by_time in (fast, slow):
        *_, last = by_time.values()
        assert not last  # every alert resolved
        for rule in rules:
            # Where it resolves is pinned: firing at one check, gone at the next evaluation.
            checks = [(_seconds(when), _rule(rule) in alerts) for when, alerts in by_time.items()]
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
    for rule in _burn_rules(spec):
        assert _rule(rule) in _expected(groups, f"just above {number(rule.factor or 0)}x")[burn]
        assert _rule(rule) not in _expected(groups, f"at {number(rule.factor or 0)}x")[burn]


def test_each_long_window_up_to_6h_lets_go_of_the_busy_step_on_time(
    generated: tuple[SLOSpec, list[dict[str, Any]]],
) -> None:
    spec, groups = generated
    busy = _expected(groups, "a busy first step, then a fast burn")
    grid = rule_evaluation_s(spec)
    pinned = [rule for rule in _burn_rules(spec) if (rule.long_window_s or 0) <= 6 * 3600]
    assert pinned
    for rule in pinned:
        long_s = rule.long_window_s or 0.0
        assert _rule(rule) not in busy[prom_duration(long_s)], rule.labels
        assert _rule(rule) in busy[prom_duration(long_s + grid)], rule.labels


def test_nothing_fires_below_the_minimum_traffic(
    generated: tuple[SLOSpec, list[dict[str, Any]]],
) -> None:
    spec, groups = generated
    least = spec.alert_policy.min_events
    assert least > 1 and spec.alert_policy.min_request_rate == 0
    below = _expected(groups, f"{least - 1} bad events")
    assert below and not any(below.values())
    at = _expected(groups, f"{least} bad events")[prom_duration(check_grid_s(spec))]
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
