"""Property: the error-budget-exhausted ticket fires alike in the live judge and in the generated
rule (through promtool), on the traffic test_judges_agree draws (tests/helpers/judged_traffic.py:
one tier's availability objective, per one-minute step, some examples tuned onto the target's
boundary).

The model: at each whole minute, `slo.alert_budget.exhausted` on the SLO window's counts (every
event since the origin: the window is 30 steps); the alert fires at a check once that held at
every minute evaluation of the last `for` (5m), as Prometheus' pending state does. The live
judge is asked every minute too (its `for` state advances only when asked, like a rule
group's evaluation), and its budget alerts at each check must be the model's; promtool must
find the same alerts, labels and annotations, at the same checks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings

from alerts.budget_alert import budget_annotations
from alerts.policy_tests import Traffic, availability_series
from middleware.clock import ScriptedClock
from middleware.live import LiveSLO
from slo import alert_budget
from slo.promql import prom_duration
from tests.helpers.drawn_examples import drawn_examples
from tests.helpers.judged_traffic import (
    CHECKS,
    LINKS,
    ORIGIN_S,
    SPEC_OBJ,
    STEP_S,
    STEPS,
    traffic,
)
from tests.helpers.promtool import promtool_test_rules

TIER = SPEC_OBJ.tiers[0]
OBJECTIVE = TIER.objectives[0]
MIN_EVENTS = SPEC_OBJ.alert_policy.min_events
HOLD_STEPS = round(alert_budget.FOR_S / STEP_S)
EXAMPLES = 40
# The comparison's edge held for the whole `for`: 10% bad exactly (the budget of 90%), then
# no traffic, so the ratio sits on the budget at every evaluation; and one bad event fewer.
_ON_EDGE = ((9,) * 20 + (0,) * 10, (1,) * 20 + (0,) * 10)
BOUNDARY = (
    Traffic(*_ON_EDGE),
    Traffic((10, *_ON_EDGE[0][1:]), (0, *_ON_EDGE[1][1:])),
)


def _model(t: Traffic) -> dict[int, bool]:
    """Whether the alert fires at each check: exhausted at every minute of the last `for`."""
    held = []
    for step in range(STEPS + 1):
        good, bad = sum(t.good[:step]), sum(t.bad[:step])
        held.append(alert_budget.exhausted(good, good + bad, OBJECTIVE, MIN_EVENTS))
    return {k: all(held[k - HOLD_STEPS : k + 1]) and k >= HOLD_STEPS for k in CHECKS}


def _live(t: Traffic) -> dict[int, bool]:
    clock = ScriptedClock(wall_s=float(ORIGIN_S))
    live = LiveSLO(SPEC_OBJ, clock=clock)
    windows = live.tiers[TIER.name]
    seen = {}
    try:
        live.firing_alerts()  # the evaluation at the origin
        for k in range(STEPS):
            clock.advance_ms(STEP_S * 500)  # mid-step
            for outcome, count in (("ok", t.good[k]), ("server_error", t.bad[k])):
                for _ in range(count):
                    live.observe(TIER.name, outcome, None)
            windows.totals(live.windows_s[0], clock.wall_s())  # counts land in this slot
            clock.advance_ms(STEP_S * 500)
            names = [a["alertname"] for a in live.firing_alerts()]
            if k + 1 in CHECKS:
                seen[k + 1] = alert_budget.ALERT_NAME in names
    finally:
        live.close()
    return seen


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traffic())
def test_live_judge_fires_the_budget_alert_as_the_model(t: Traffic) -> None:
    assert _live(t) == _model(t)


def test_the_edge_fires_and_one_bad_event_fewer_does_not() -> None:
    assert [_model(t)[30] for t in BOUNDARY] == [True, False]
    assert [_live(t)[30] for t in BOUNDARY] == [True, False]


def _group(index: int, t: Traffic, fires: dict[int, bool]) -> dict[str, Any]:
    expected = {
        "exp_labels": alert_budget.budget_labels(TIER, OBJECTIVE),
        "exp_annotations": budget_annotations(SPEC_OBJ, TIER, OBJECTIVE, LINKS),
    }
    return {
        "name": f"example {index}",
        "interval": prom_duration(STEP_S),
        "input_series": availability_series(TIER.name, t),
        "alert_rule_test": [
            {
                "eval_time": prom_duration(step * STEP_S),
                "alertname": alert_budget.ALERT_NAME,
                "exp_alerts": [expected] if fired else [],
            }
            for step, fired in fires.items()
        ],
    }


def test_generated_rule_fires_the_budget_alert_as_the_model(tmp_path: Path) -> None:
    drawn = [*BOUNDARY, *drawn_examples(traffic(), EXAMPLES)]
    examples = [(t, _model(t)) for t in drawn]
    fired = [f for _, fires in examples for f in fires.values()]
    assert any(fired) and not all(fired)  # both kinds of check, or promtool proves half
    for t, fires in examples:
        assert _live(t) == fires
    groups = [_group(i, t, fires) for i, (t, fires) in enumerate(examples)]
    result = promtool_test_rules(tmp_path, SPEC_OBJ, LINKS, groups, STEP_S, "budget_agree")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
