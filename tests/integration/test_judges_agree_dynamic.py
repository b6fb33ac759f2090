"""Property: traffic-aware burn rates and the minimum-request-rate guard are judged alike by
the live windows (`/slo`, in-process alerts) and the generated rules (through promtool), both
equal to the model: `AlertRule.fires` on exact counts, i.e. `slo.arithmetic`.

The spec pairs a dynamic page with a static ticket, and guards both with min_events and
min_request_rate. Traffic: per one-minute step, good and bad requests, events mid-step, so
Prometheus' closed ranges on 1m samples and the live rings hold the same events at every
whole-minute check (as in test_judges_agree.py). `slo check` on the same requests as records
judges them alike too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alerts.policy_tests import Traffic, availability_series
from alerts.rules import Links, shown_annotations
from middleware.clock import ScriptedClock
from middleware.live import LiveSLO
from slo.alert_budget import ALERT_NAME as BUDGET_ALERT
from slo.alert_rules import URGENCY, AlertRule, alert_rules
from slo.check.evaluate import evaluate
from slo.promql import prom_duration
from slo.records import RequestRecord
from slo.spec import SLOSpec
from slo.units import format_duration
from tests.helpers.drawn_examples import drawn_examples
from tests.helpers.promtool import promtool_test_rules
from tests.helpers.tier_specs import burn_alert, burn_policy, make_tier, spec_yaml

STEP_S = 60
STEPS = 30
CHECKS = (5, 10, 15, 20, 25, 30)
SPEC = SLOSpec.from_yaml(
    spec_yaml(
        make_tier("premium", "availability >= 90%", priority=0, default=True),
        window="30m",
        alert_policy={
            **burn_policy(
                {**burn_alert("page", "10m", "5m", 2), "dynamic": True},
                burn_alert("ticket", "20m", "10m", 1),
                min_events=5,
                thresholds=(),
            ),
            "min_request_rate": 0.1,
            "anomalies": {"enabled": False},
        },
    )
)
ORIGIN_S = 1_800_000_000 - 1_800_000_000 % 3600
RULES = [r for r in alert_rules(SPEC) if r.kind == "burn_rate"]
LINKS = Links()
EXAMPLES = 30


@st.composite
def traffic(draw: st.DrawFn) -> Traffic:
    rates = draw(st.lists(st.integers(0, 20), min_size=STEPS, max_size=STEPS))
    bad_share = draw(st.lists(st.integers(0, 20), min_size=STEPS, max_size=STEPS))
    bad = [min(b, n) for b, n in zip(bad_share, rates, strict=True)]
    return Traffic(tuple(n - b for n, b in zip(rates, bad, strict=True)), tuple(bad))


def _key(rule: AlertRule) -> tuple[str, str]:
    return prom_duration(rule.long_window_s or 0), prom_duration(rule.short_window_s or 0)


def _model(t: Traffic, step: int) -> set[tuple[str, str]]:
    fired = set()
    for rule in RULES:
        counts = [t.window_counts(step, round(w / STEP_S)) for w in rule.counted_windows_s]
        if rule.fires(counts):
            fired.add(_key(rule))
    return fired


def _live(t: Traffic) -> dict[int, set[tuple[str, str]]]:
    clock = ScriptedClock(wall_s=float(ORIGIN_S))
    live = LiveSLO(SPEC, clock=clock)
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
                seen[k + 1] = {
                    (a["labels"]["long_window"], a["labels"]["short_window"])
                    for a in live.firing_alerts()
                    if a["alertname"] != BUDGET_ALERT  # test_judges_agree_budget's
                }
    finally:
        live.close()
    return seen


def _judge(t: Traffic) -> list[tuple[int, set[tuple[str, str]]]]:
    live = _live(t)
    for step in CHECKS:
        assert live[step] == _model(t, step), step
    return [(step, live[step]) for step in CHECKS]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traffic())
def test_live_windows_agree_with_the_arithmetic(t: Traffic) -> None:
    _judge(t)


def _evaluator(t: Traffic, step: int) -> set[tuple[str, str]]:
    """`slo check`'s burn-rate alerts on the requests of the first `step` steps as records."""
    records = [
        RequestRecord(request_id=f"{k}-{outcome}-{i}", timestamp=ORIGIN_S + (k + 0.5) * STEP_S,
                      tier="premium", outcome=outcome, e2e_s=0.01)
        for k in range(step)
        for outcome, count in (("ok", t.good[k]), ("server_error", t.bad[k]))
        for i in range(count)
    ]  # fmt: skip
    result = evaluate(SPEC, records, now=ORIGIN_S + step * STEP_S).tiers[0].objectives[0]
    names = {
        f"{URGENCY[rule.severity]} {format_duration(rule.long_window_s or 0)}/"
        f"{format_duration(rule.short_window_s or 0)} x{rule.factor:g}": _key(rule)
        for rule in RULES
    }
    return {names[alert] for alert in result.alerts}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traffic())
def test_slo_check_agrees_with_the_arithmetic(t: Traffic) -> None:
    for step in CHECKS:
        assert _evaluator(t, step) == _model(t, step), step


def _group(index: int, t: Traffic, checks: list[tuple[int, set[tuple[str, str]]]]) -> Any:
    tests = []
    for step, keys in checks:
        for name in dict.fromkeys(r.name for r in RULES):
            firing = [r for r in RULES if r.name == name and _key(r) in keys]
            tests.append(
                {
                    "eval_time": prom_duration(step * STEP_S),
                    "alertname": name,
                    "exp_alerts": [
                        {
                            "exp_labels": r.labels_with_phase(),
                            "exp_annotations": shown_annotations(r, SPEC, LINKS),
                        }
                        for r in firing
                    ],
                }
            )
    return {
        "name": f"example {index}",
        "interval": prom_duration(STEP_S),
        "input_series": availability_series("premium", t),
        "alert_rule_test": tests,
    }


def test_generated_rules_agree_through_promtool(tmp_path: Path) -> None:
    examples = [(t, _judge(t)) for t in drawn_examples(traffic(), EXAMPLES)]
    fired = [bool(keys) for _, checks in examples for _, keys in checks]
    assert any(fired) and not all(fired)  # both kinds of check
    dynamic = {("10m", "5m") in keys for _, checks in examples for _, keys in checks}
    assert dynamic == {True, False}  # the dynamic page both fires and stays silent
    groups = [_group(i, t, checks) for i, (t, checks) in enumerate(examples)]
    result = promtool_test_rules(tmp_path, SPEC, LINKS, groups, STEP_S, "test_judges_dynamic")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
