"""Property: the evaluator, the live windows and the generated rules (through promtool) judge
latency objectives alike, in both forms, and goodput.

One tier holds availability, a ratio-form latency objective (`90% of requests ttft <= 200ms`),
a percentile-form one (`p95 e2e <= 1s`) and goodput. Per one-minute step the traffic is counts
of five kinds of request: ok with TTFT and e2e each good or bad, and server errors (which
latency objectives leave out and availability and goodput count). Goodput's good requests are
the ok ones with both good; Prometheus sees them in `llm_slo_good_requests_total`, which the
middleware counts per request as the live windows do. Each ok request takes a
(ttft, e2e) pair from a fixed table: values inside different buckets, away from every bound but
the thresholds themselves (a value equal to an inclusive threshold is good in every judge: the
`le` bucket holds it), some in the +Inf bucket.

Percentile form: the evaluator judges `p95 e2e <= 1s` by the nearest-rank p95 of the values, the
live windows and Prometheus by counts in the `le="1.0"` bucket (the threshold is a bucket bound,
`slo.sli.buckets_for`). README "What is measured" promises these agree: the nearest-rank p95 is
within the threshold exactly when at least ceil(0.95 n) values are. So every judge's verdict
must be `slo.arithmetic.verdict` of the same good and events counts, and the percentile each
shows (nearest rank in `slo check`, `histogram_quantile` on `/slo` and in PromQL) lies within
the threshold exactly when the counts meet the target.

Boundaries: examples are tuned so that one objective's good count over the SLO window sits
exactly on its required count, or one below, at the last check (explicit examples cover every
objective; hypothesis draws more). Timing as in test_judges_agree: events mid-step, checks on
whole minutes, so every judge's window holds the same events.

Alerts: the burn-rate alerts of `slo check` and the live windows must be the same; the live
ones, threshold alerts included (p95 above 2x, p50 above 1x the threshold, over 5m: a
`histogram_quantile` that only the live windows and Prometheus compute), are what promtool must
see fire, goodput's burn-rate alerts among them, and the SLO window's records of every
objective hold the model's counts. One promtool run, every example:
the explicit ones and examples of the same strategy drawn the same way every run, each judged
by the evaluator and the live windows first (the promtool test needs no other test to run).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from alerts.policy_tests import (
    Traffic,
    availability_series,
    good_requests_series,
    histogram_series,
)
from alerts.rules import Links, shown_annotations
from middleware.clock import ScriptedClock
from middleware.live import LiveSLO
from middleware.request.timeline import Breakdown
from slo.alert_budget import ALERT_NAME as BUDGET_ALERT
from slo.alert_rules import AlertRule, alert_rules
from slo.arithmetic import meets, required_good, verdict, within
from slo.check.evaluate import evaluate
from slo.promql import number, prom_duration, record_error_ratio, record_events, selector
from slo.records import RequestRecord
from slo.sli import CATALOG, buckets_for
from slo.spec import SLOSpec
from slo.spec.objectives import Objective
from slo.units import format_duration
from tests.helpers.drawn_examples import drawn_examples
from tests.helpers.promtool import promtool_test_rules
from tests.helpers.tier_specs import burn_alert, burn_policy, make_tier, spec_yaml, threshold_alert

STEP_S = 60
STEPS = 30
CHECKS = (5, 10, 15, 20, 25, 30)
TIER = "premium"
SPEC = spec_yaml(
    make_tier(
        "premium",
        "availability >= 90%",
        "90% of requests ttft <= 200ms",
        "p95 e2e <= 1s",
        "goodput >= 80%",
        priority=0,
        default=True,
    ),
    window="30m",
    alert_policy=burn_policy(
        burn_alert("page", "30m", "5m", 5),
        burn_alert("page", "20m", "10m", 2),
        burn_alert("ticket", "30m", "10m", 1),
        min_events=10,
        thresholds=[threshold_alert(95, 2), threshold_alert(50, 1)],
    ),
)
ORIGIN_S = 1_800_000_000 - 1_800_000_000 % 3600  # slot edges on whole seconds (see sibling)
SPEC_OBJ = SLOSpec.from_yaml(SPEC)
OBJECTIVES: dict[str, Objective] = {o.name: o for o in SPEC_OBJ.tiers[0].objectives}
AVAILABILITY, TTFT, E2E, GOODPUT = OBJECTIVES
LATENCY = (TTFT, E2E)
RULES = [r for r in alert_rules(SPEC_OBJ) if r.kind != "absent"]  # absent: Prometheus only
AlertKey = tuple[tuple[str, str], ...]  # an alert's labels, alertname included, sorted


def _key(rule: AlertRule) -> AlertKey:
    return tuple(sorted({"alertname": rule.name, **rule.labels}.items()))


LINKS = Links()

# Request kinds, the index of their count in a step: ok with (ttft, e2e) good or bad; errors.
GG, GB, BG, BB, ERR = range(5)
OK_KINDS = (GG, GB, BG, BB)
# (ttft_s, e2e_s) pairs per ok kind, taken in turn; e2e >= ttft as in a real request.
VALUES: dict[int, tuple[tuple[float, float], ...]] = {
    GG: ((0.004, 0.03), (0.05, 0.5), (0.15, 0.9), (0.2, 1.0)),
    GB: ((0.09, 1.1), (0.2, 3.0), (0.15, 90.0)),
    BG: ((0.22, 0.3), (0.6, 0.7), (0.9, 0.95)),
    BB: ((0.3, 1.5), (3.0, 6.0), (12.0, 30.0)),
}
# Moves that lower an objective's good count by one request (the reverse raises it); events stay.
MOVES: dict[str, tuple[tuple[int, int], ...]] = {
    AVAILABILITY: ((GG, ERR), (GB, ERR), (BG, ERR), (BB, ERR)),
    TTFT: ((GG, BG), (GB, BB)),
    E2E: ((GG, GB), (BG, BB)),
    GOODPUT: ((GG, GB), (GG, BG), (GG, BB), (GG, ERR)),
}
EXAMPLES = 40


def _good_kinds(name: str) -> tuple[int, ...]:
    return {AVAILABILITY: OK_KINDS, TTFT: (GG, GB), E2E: (GG, BG), GOODPUT: (GG,)}[name]


def _event_kinds(name: str) -> tuple[int, ...]:
    return OK_KINDS if name in LATENCY else (*OK_KINDS, ERR)


def _check_table() -> None:
    """The value table must say what its kinds claim, or the test would prove nothing."""
    for kind, pairs in VALUES.items():
        for ttft, e2e in pairs:
            for name, value in ((TTFT, ttft), (E2E, e2e)):
                objective = OBJECTIVES[name]
                good = within(value, objective.threshold_s or 0.0, objective.inclusive)
                assert good == (kind in _good_kinds(name)), (kind, name, value)
                bounds = buckets_for(objective.sli or "", SPEC_OBJ)
                assert value == objective.threshold_s or value not in bounds, value


_check_table()


class Request(NamedTuple):
    outcome: str
    ttft_s: float | None  # None: no token reached the client (a server error)
    e2e_s: float


@dataclass(frozen=True)
class Steps:
    """Counts per kind (GG, GB, BG, BB, ERR) in each one-minute step."""

    counts: tuple[tuple[int, ...], ...]

    def totals(self, name: str, start: int = 0, stop: int = STEPS) -> tuple[int, int]:
        """(good, events) of one objective over steps [start, stop)."""
        steps = self.counts[start:stop]
        good = sum(step[k] for step in steps for k in _good_kinds(name))
        return good, sum(step[k] for step in steps for k in _event_kinds(name))

    def requests(self, step: int) -> list[Request]:
        """Every request of one step, in a fixed order."""
        found: list[Request] = []
        for kind in OK_KINDS:
            pairs = VALUES[kind]
            found += [
                Request("ok", *pairs[(step + i) % len(pairs)])
                for i in range(self.counts[step][kind])
            ]
        return found + [Request("server_error", None, 0.05)] * self.counts[step][ERR]

    def ok_values(self, step: int, field: str) -> list[float]:
        """The `ttft_s` or `e2e_s` values of one step's ok requests: what the histograms see."""
        return [getattr(r, field) for r in self.requests(step) if r.outcome == "ok"]

    def tuned(self, name: str, offset: int) -> Steps:
        """The good count of `name` over the whole window moved to the required count + offset
        (one request at a time, from the last step back); unchanged where that cannot be."""
        good, events = self.totals(name)
        need = required_good(OBJECTIVES[name].target, events) + offset
        if not 0 <= need <= events:
            return self
        moves = MOVES[name] if good > need else tuple((b, a) for a, b in MOVES[name])
        counts = [list(step) for step in self.counts]
        left = abs(good - need)
        for step in reversed(counts):
            for source, target in moves:
                moved = min(left, step[source])
                step[source] -= moved
                step[target] += moved
                left -= moved
        assert left == 0
        return replace(self, counts=tuple(tuple(step) for step in counts))


@st.composite
def traffic(draw: st.DrawFn) -> Steps:
    # Each kind of bad request gets its own ceiling: at 0 or 1 against up to 16 good ones a
    # step, the share of bad events hovers around the targets, so verdicts and alerts go both
    # ways; at 6 the budget burns and the alerts fire.
    caps = [draw(st.sampled_from([0, 0, 1, 2, 6])) for _ in (GB, BG, BB, ERR)]
    step = st.tuples(st.integers(0, 16), *(st.integers(0, cap) for cap in caps))
    steps = Steps(tuple(draw(st.lists(step, min_size=STEPS, max_size=STEPS))))
    name = draw(st.sampled_from([None, *OBJECTIVES]))
    return steps if name is None else steps.tuned(name, draw(st.sampled_from([0, -1])))


def _steady(per_step: tuple[int, ...]) -> Steps:
    return Steps((per_step,) * STEPS)


# Per objective, the good count exactly on the required one and one below it at the last check.
BOUNDARY_EXAMPLES = [
    _steady((7, 1, 1, 1, 1)).tuned(name, offset) for name in OBJECTIVES for offset in (0, -1)
]
# The low-traffic guard at its edge: every 5m window at a check holds exactly min_events (10)
# latency events, or one fewer (a step of 1 instead of 2 in each five).
BOUNDARY_EXAMPLES += [
    _steady((1, 0, 0, 1, 1)),
    Steps(tuple((0, 0, 0, 1 if k % 5 == 4 else 2, 0) for k in range(STEPS))),
]


def _burn_alerts(objective: str, names: tuple[str, ...]) -> set[AlertKey]:
    """The rules behind the evaluator's alert names ("page 30m/5m x5") of one objective."""
    by_name = {
        f"{format_duration(r.long_window_s or 0)}/{format_duration(r.short_window_s or 0)}"
        f" x{r.factor:g}": _key(r)
        for r in RULES
        if r.kind == "burn_rate" and r.objective is not None and r.objective.name == objective
    }
    return {by_name[name.split(" ", 1)[1]] for name in names}


def _evaluator(records: list[RequestRecord], step: int) -> dict[str, tuple[Any, ...]]:
    """Per objective: (verdict, alerts, good, events, burn rates, observed) of `slo check`."""
    report = evaluate(SPEC_OBJ, records, now=ORIGIN_S + step * STEP_S)
    judged = {}
    for result in report.tiers[0].objectives:
        burns = {format_duration(b.window_s): b.burn_rate for b in result.burn}
        alerts = _burn_alerts(result.objective.name, result.alerts)
        judged[result.objective.name] = (
            result.verdict, alerts, result.good, result.events, burns, result.observed_s
        )  # fmt: skip
    return judged


def _records(t: Steps) -> list[RequestRecord]:
    return [
        RequestRecord(
            request_id=f"{k}-{i}",
            timestamp=ORIGIN_S + (k + 0.5) * STEP_S,
            tier=TIER,
            outcome=outcome,
            ttft_s=ttft,
            e2e_s=e2e,
            output_tokens=8,
        )
        for k in range(STEPS)
        for i, (outcome, ttft, e2e) in enumerate(t.requests(k))
    ]


def _breakdown(ttft: float, e2e: float) -> Breakdown:
    # Only ttft and e2e are judged here; the phases still add up to e2e, as the middleware's do.
    return Breakdown(e2e, ttft, None, (), 0.0, None, None, 0.0, 0.0, e2e, 8)


def _live(t: Steps) -> dict[int, dict[str, tuple[Any, ...]]]:
    """Per check, per objective: what `/slo` says, fed as middleware/core.py `_finish` feeds it."""
    clock = ScriptedClock(wall_s=float(ORIGIN_S))
    live = LiveSLO(SPEC_OBJ, clock=clock)
    windows = live.tiers[TIER]
    seen: dict[int, dict[str, tuple[Any, ...]]] = {}
    try:
        for k in range(STEPS):
            clock.advance_ms(STEP_S * 500)  # mid-step
            for outcome, ttft, e2e in t.requests(k):
                observed = _breakdown(ttft, e2e) if ttft is not None else None
                live.observe(TIER, outcome, observed)
            windows.totals(live.windows_s[0], clock.wall_s())  # counts land in this slot
            clock.advance_ms(STEP_S * 500)
            if k + 1 not in CHECKS:
                continue
            alerts: dict[str, set[AlertKey]] = {name: set() for name in OBJECTIVES}
            for alert in live.firing_alerts():
                if alert["alertname"] == BUDGET_ALERT:
                    continue  # test_judges_agree_budget's
                alerts[alert["labels"]["objective"]].add(tuple(sorted(alert["labels"].items())))
            seen[k + 1] = {
                o["objective"]: (
                    o["verdict"],
                    alerts[o["objective"]],
                    o["good"],
                    o["events"],
                    o["burn_rates"],
                    o.get("observed"),
                )
                for o in live.status()["tiers"][0]["objectives"]
            }
    finally:
        live.close()
    return seen


# Nothing at all, and nothing but good requests.
EXPLICIT_EXAMPLES = [_steady((0, 0, 0, 0, 0)), _steady((8, 0, 0, 0, 0)), *BOUNDARY_EXAMPLES]
Check = tuple[int, dict[str, tuple[int, int]], set[AlertKey]]  # step, (good, events), firing


def _judge(t: Steps) -> list[Check]:
    """Every judge but Prometheus at every check, asserted to agree; what promtool must see."""
    live = _live(t)
    records = _records(t)
    checks = []
    for step in CHECKS:
        judged = _evaluator(records, step)
        expected: dict[str, tuple[int, int]] = {}
        firing: set[AlertKey] = set()
        for name, objective in OBJECTIVES.items():
            verdict_, alerts, good, events, burns, observed = judged[name]
            model_good, model_events = t.totals(name, 0, step)
            assert (good, events) == (model_good, model_events), (step, name)
            # One verdict, whatever the form: the counts' (README "What is measured").
            assert verdict_ == verdict(good, events, objective.target, SPEC_OBJ.min_events)
            live_verdict, live_alerts, live_good, live_events, live_burns, live_observed = live[
                step
            ][name]
            assert (live_verdict, live_good, live_events, live_burns) == (
                verdict_, float(good), float(events), burns
            ), (step, name)  # fmt: skip
            if objective.kind == "latency" and events:
                # The percentile each judge shows sits within the threshold exactly when the
                # counts meet the target: nearest rank here, histogram_quantile on /slo.
                met = meets(good, events, objective.target)
                threshold, inclusive = objective.threshold_s or 0.0, objective.inclusive
                assert within(observed, threshold, inclusive) == met, (step, name, observed)
                assert within(live_observed, threshold, inclusive) == met, (step, name)
            # Burn-rate alerts: the evaluator's and the live ones. Threshold alerts (a histogram
            # percentile over 5m) are the live windows' and Prometheus' only.
            assert {a for a in live_alerts if "long_window" in dict(a)} == alerts, (step, name)
            firing |= live_alerts
            expected[name] = (good, events)
        checks.append((step, expected, firing))
    return checks


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traffic())
def test_evaluator_and_live_windows_agree(t: Steps) -> None:
    _judge(t)


for _explicit in EXPLICIT_EXAMPLES:
    test_evaluator_and_live_windows_agree = example(_explicit)(
        test_evaluator_and_live_windows_agree
    )


def _series(t: Steps) -> list[dict[str, str]]:
    ok = tuple(sum(step[k] for k in OK_KINDS) for step in t.counts)
    series = availability_series(TIER, Traffic(ok, tuple(step[ERR] for step in t.counts)))
    # What the middleware's good-requests counter holds: per step, the requests good for
    # goodput (the same per-request decision as the live windows above, GG alone).
    good = [sum(step[k] for k in _good_kinds(GOODPUT)) for step in t.counts]
    series.append(good_requests_series(TIER, good))
    for objective in LATENCY:
        sli = OBJECTIVES[objective].sli or ""
        field = CATALOG[sli].record_field or ""
        values = [t.ok_values(k, field) for k in range(STEPS)]
        series += histogram_series(CATALOG[sli].metric, TIER, buckets_for(sli, SPEC_OBJ), values)
    return series


def _expr_tests(eval_time: str, name: str, good: int, events: int) -> list[dict[str, Any]]:
    """The generated SLO-window records, and for latency the percentile PromQL shows."""
    objective = OBJECTIVES[name]
    labels = {"tier": TIER, "objective": name}
    record_labels = {"tier": TIER, "sli": objective.indicator, "objective": name}
    window_s = SPEC_OBJ.window_s
    events_record = record_events(window_s)
    tests: list[tuple[str, str, float]] = [
        (selector(events_record, **labels), selector(events_record, **record_labels), events)
    ]
    if events:  # with no events the ratio is NaN, which promtool cannot expect
        ratio_record = record_error_ratio(window_s)
        ratio = (events - good) / events  # the one division the rule does, on exact counts
        tests.append(
            (selector(ratio_record, **labels), selector(ratio_record, **record_labels), ratio)
        )
        if objective.kind == "latency":
            metric = CATALOG[objective.sli or ""].metric
            buckets = selector(metric + "_bucket", tier=TIER)
            quantile = (
                f"histogram_quantile({number(objective.target)}, sum by (le) "
                f"(increase({buckets}[{prom_duration(window_s)}])))"
                f" <= bool {number(objective.threshold_s or 0)}"
            )
            tests.append((quantile, "{}", int(meets(good, events, objective.target))))
    return [
        {"expr": expr, "eval_time": eval_time, "exp_samples": [{"labels": shown, "value": value}]}
        for expr, shown, value in tests
    ]


def _group(index: int, example_: dict[str, Any]) -> dict[str, Any]:
    alert_tests, expr_tests = [], []
    for step, expected, firing_keys in example_["checks"]:
        eval_time = prom_duration(step * STEP_S)
        for alertname in dict.fromkeys(r.name for r in RULES):
            firing = [r for r in RULES if r.name == alertname and _key(r) in firing_keys]
            alert_tests.append(
                {
                    "eval_time": eval_time,
                    "alertname": alertname,
                    "exp_alerts": [
                        {
                            # No phase histograms in this traffic: latency alerts blame none.
                            "exp_labels": r.labels_with_phase(),
                            "exp_annotations": shown_annotations(r, SPEC_OBJ, LINKS),
                        }
                        for r in firing
                    ],
                }
            )
        for name in OBJECTIVES:
            good, events = expected[name]
            expr_tests += _expr_tests(eval_time, name, good, events)
    return {
        "name": f"example {index}",
        "interval": prom_duration(STEP_S),
        "input_series": _series(example_["traffic"]),
        "alert_rule_test": alert_tests,
        "promql_expr_test": expr_tests,
    }


def test_generated_rules_agree_through_promtool(tmp_path: Path) -> None:
    traffic_ = EXPLICIT_EXAMPLES + drawn_examples(traffic(), EXAMPLES)
    examples = [{"traffic": t, "checks": _judge(t)} for t in traffic_]
    # Both kinds of check, or promtool would confirm only silence (or only alerts).
    fired = [bool(firing) for example_ in examples for _, _, firing in example_["checks"]]
    assert any(fired) and not all(fired)
    # Goodput's alerts too: promtool must see them fire somewhere and stay quiet elsewhere.
    goodput = [
        any(dict(key)["objective"] == GOODPUT for key in firing)
        for example_ in examples
        for _, _, firing in example_["checks"]
    ]
    assert any(goodput) and not all(goodput)
    groups = [_group(i, example_) for i, example_ in enumerate(examples)]
    result = promtool_test_rules(
        tmp_path, SPEC_OBJ, LINKS, groups, STEP_S, "test_judges_agree_latency"
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
