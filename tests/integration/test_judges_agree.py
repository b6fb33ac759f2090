"""Property: the evaluator, the live windows and the generated rules (through promtool) judge
the same synthetic traffic alike: every verdict and every firing burn-rate alert.

Traffic: per one-minute step, good and bad requests of one tier's availability objective; the
last step is tuned, in some examples, so that the good count over the SLO window sits exactly on
the target's required count or one below it. Events happen mid-step, so the evaluator's
[now - W, now], Prometheus' closed range on 1m samples and the live rings (slots of W/60, at
most 30s here) all hold the same events at every whole-minute check.

Hypothesis drives the evaluator and the live windows per example. The promtool test draws its
own examples of the same strategy (derandomized: the same ones every run, whatever else runs),
judges each with the evaluator and the live windows as the property does, and runs promtool
once, on one generated test file with a group per example: its alerts must be the evaluator's,
and its good/events counts the model's (whose verdict is the same `slo.arithmetic.verdict`
both other judges gave).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings

from alerts.policy_tests import Traffic, availability_series
from alerts.rules import REQUESTS, alert_annotations
from middleware.clock import ScriptedClock
from middleware.live import LiveSLO
from slo.alert_budget import ALERT_NAME as BUDGET_ALERT
from slo.alert_rules import alert_rules
from slo.arithmetic import verdict
from slo.check.evaluate import evaluate
from slo.promql import prom_duration
from slo.records import RequestRecord
from slo.units import format_duration
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

RULES = [r for r in alert_rules(SPEC_OBJ) if r.kind == "burn_rate"]
EXAMPLES = 40


def _key(long_s: float, short_s: float) -> tuple[str, str]:
    return prom_duration(long_s), prom_duration(short_s)


def _evaluator(t: Traffic, step: int) -> tuple[str, set[tuple[str, str]], int, int]:
    records = [
        RequestRecord(
            request_id=f"{k}-{outcome}-{i}",
            timestamp=ORIGIN_S + (k + 0.5) * STEP_S,
            tier="premium",
            outcome=outcome,
            e2e_s=0.01,
        )
        for k in range(step)
        for outcome, count in (("ok", t.good[k]), ("server_error", t.bad[k]))
        for i in range(count)
    ]
    report = evaluate(SPEC_OBJ, records, now=ORIGIN_S + step * STEP_S)
    result = report.tiers[0].objectives[0]
    names = {
        f"{r.severity} {format_duration(r.long_window_s)}/{format_duration(r.short_window_s)}"
        f" x{r.factor:g}": _key(r.long_window_s, r.short_window_s)
        for r in SPEC_OBJ.alert_policy.burn_rates
    }
    return result.verdict, {names[a] for a in result.alerts}, result.good, result.events


def _live(t: Traffic) -> dict[int, tuple[str, set[tuple[str, str]], float, float]]:
    clock = ScriptedClock(wall_s=float(ORIGIN_S))
    live = LiveSLO(SPEC_OBJ, clock=clock)
    windows = live.tiers["premium"]
    seen = {}
    try:
        for k in range(STEPS):
            clock.advance_ms(STEP_S * 500)  # mid-step
            for outcome, count in (("ok", t.good[k]), ("server_error", t.bad[k])):
                for _ in range(count):
                    live.observe("premium", outcome, None)
            windows.totals(live.windows_s[0], clock.wall_s())  # counts land in this slot
            clock.advance_ms(STEP_S * 500)
            if k + 1 in CHECKS:
                objective = live.status()["tiers"][0]["objectives"][0]
                alerts = {
                    (a["labels"]["long_window"], a["labels"]["short_window"])
                    for a in live.firing_alerts()
                    if a["alertname"] != BUDGET_ALERT  # test_judges_agree_budget's
                }
                seen[k + 1] = (objective["verdict"], alerts, objective["good"], objective["events"])
    finally:
        live.close()
    return seen


Check = tuple[int, set[tuple[str, str]], int, int]  # step, firing alerts, good, events


def _judge(t: Traffic) -> list[Check]:
    """The evaluator's and the live windows' judgement at every check, asserted equal."""
    live = _live(t)
    checks = []
    for step in CHECKS:
        judged, alerts, good, events = _evaluator(t, step)
        assert live[step] == (judged, alerts, float(good), float(events)), step
        assert judged == verdict(
            good, events, SPEC_OBJ.tiers[0].objectives[0].target, SPEC_OBJ.min_events
        )
        checks.append((step, alerts, good, events))
    return checks


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traffic())
def test_evaluator_and_live_windows_agree(t: Traffic) -> None:
    _judge(t)


def _group(index: int, example: dict[str, Any]) -> dict[str, Any]:
    t: Traffic = example["traffic"]
    alert_tests, expr_tests = [], []
    selector = f'{REQUESTS}{{tier="premium"}}'
    for step, alerts, good, events in example["checks"]:
        expected = [r for r in RULES if _key(r.long_window_s or 0, r.short_window_s or 0) in alerts]
        eval_time = prom_duration(step * STEP_S)
        alert_tests.append(
            {
                "eval_time": eval_time,
                "alertname": RULES[0].name,
                "exp_alerts": [
                    {
                        "exp_labels": r.labels,
                        "exp_annotations": alert_annotations(r, SPEC_OBJ, LINKS),
                    }
                    for r in expected
                ],
            }
        )
        window = prom_duration(SPEC_OBJ.window_s)
        for expr, value in (
            (f'sum(increase({selector[:-1]}, outcome="ok"}}[{window}]))', good),
            (f"sum(increase({selector}[{window}]))", events),
        ):
            expr_tests.append(
                {
                    "expr": expr,
                    "eval_time": eval_time,
                    "exp_samples": [{"labels": "{}", "value": value}],
                }
            )
    return {
        "name": f"example {index}",
        "interval": prom_duration(STEP_S),
        "input_series": availability_series("premium", t),
        "alert_rule_test": alert_tests,
        "promql_expr_test": expr_tests,
    }


def test_generated_rules_agree_through_promtool(tmp_path: Path) -> None:
    examples = [{"traffic": t, "checks": _judge(t)} for t in drawn_examples(traffic(), EXAMPLES)]
    assert len(examples) >= EXAMPLES // 2, len(examples)
    # Both kinds of check, or promtool would confirm only silence (or only alerts).
    fired = [bool(alerts) for example in examples for _, alerts, _, _ in example["checks"]]
    assert any(fired) and not all(fired)
    groups = [_group(i, example) for i, example in enumerate(examples)]
    result = promtool_test_rules(tmp_path, SPEC_OBJ, LINKS, groups, STEP_S, "test_judges_agree")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
