"""Traffic-aware burn rates and the guards, through promtool on the generated rules, with the
expected alerts from `AlertRule.fires` (the arithmetic the live judge calls):

- a dynamic burn rate fires at the same absolute count of bad events at 1 and at 100
  requests/s (the SLO window holding the same events), where a static one needs 100x more;
- a lone bad request at 0.05 requests/s pages nobody;
- a full outage after an hour at 10 requests/s pages (14.4x over 1h/5m) within 2 minutes;
- the minimum-request-rate guard keeps a burn at 0.05 requests/s silent that the
  minimum-events guard alone lets through.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alerts.policy_tests import Traffic, availability_series
from alerts.rules import Links, shown_annotations
from slo.alert_rules import AlertRule, alert_rules
from slo.promql import prom_duration
from slo.spec import SLOSpec
from tests.helpers.promtool import promtool_test_rules
from tests.helpers.tier_specs import burn_alert, burn_policy, make_tier, spec_yaml

STEP_S = 60
LINKS = Links()
DYNAMIC = SLOSpec.from_yaml(
    spec_yaml(
        make_tier("premium", "availability >= 99%", default=True),
        window="1h",
        alert_policy={
            **burn_policy(
                {**burn_alert("page", "10m", "2m", 2), "dynamic": True},
                burn_alert("ticket", "10m", "2m", 2),  # the static peer, same windows
                min_events=1,
                thresholds=(),
            ),
            "anomalies": {"enabled": False},
        },
    )
)


def _expected(spec: SLOSpec, traffic: Traffic, step: int) -> list[AlertRule]:
    fired = []
    for rule in alert_rules(spec):
        if rule.kind != "burn_rate":
            continue
        counts = [
            traffic.window_counts(step, round(window / STEP_S)) for window in rule.counted_windows_s
        ]
        if rule.fires(counts):
            fired.append(rule)
    return fired


def _group(name: str, spec: SLOSpec, traffic: Traffic, step: int) -> dict[str, Any]:
    rules = [r for r in alert_rules(spec) if r.kind == "burn_rate"]
    fired = _expected(spec, traffic, step)
    return {
        "name": name,
        "interval": prom_duration(STEP_S),
        "input_series": availability_series("premium", traffic),
        "alert_rule_test": [
            {
                "eval_time": prom_duration(step * STEP_S),
                "alertname": rules[0].name,
                "exp_alerts": [
                    {
                        "exp_labels": r.labels_with_phase(),
                        "exp_annotations": shown_annotations(r, spec, LINKS),
                    }
                    for r in fired
                ],
            }
        ],
    }


def _dynamic_traffic(now_per_s: int, before_per_s: float, bad: list[int]) -> Traffic:
    """50 minutes at `before_per_s`, 10 at `now_per_s`, `bad` in the last len(bad) minutes."""
    events = [round(before_per_s * 60)] * 50 + [now_per_s * 60] * 10
    bads = [0] * (60 - len(bad)) + bad
    return Traffic(tuple(e - b for e, b in zip(events, bads, strict=True)), tuple(bads))


def test_dynamic_burn_fires_at_the_same_bad_count_at_1_and_100_per_s(tmp_path: Path) -> None:
    # Both hold 60,600 events over the hour: 50 min at 20/s + 10 at 1/s, or 50 at 0.2/s + 10
    # at 100/s. Allowed over 10m: 2% x 60,600 x 10m/1h = 202 bad events; 203 fires.
    groups = []
    for now_per_s, before_per_s in ((1, 20.0), (100, 0.2)):
        for bad in ([50, 50, 51, 52], [50, 50, 51, 51]):
            traffic = _dynamic_traffic(now_per_s, before_per_s, bad)
            fired = {r.severity for r in _expected(DYNAMIC, traffic, 60)}
            # The model's promise: the dynamic page at 203 bad whatever the traffic; the static
            # ticket at 1/s only (34% of 600), never at 100/s (0.34% of 60,000).
            assert ("critical" in fired) == (sum(bad) == 203), (now_per_s, bad)
            assert ("warning" in fired) == (now_per_s == 1), (now_per_s, bad)
            name = f"dynamic at {now_per_s}/s, {sum(bad)} bad"
            groups.append(_group(name, DYNAMIC, traffic, 60))
    result = promtool_test_rules(tmp_path, DYNAMIC, LINKS, groups, STEP_S, "test_burn_guards")
    assert result.returncode == 0, result.stdout + result.stderr


def _default_policy_spec(**policy: Any) -> SLOSpec:
    """One tier with premium's availability and the default burn rates."""
    return SLOSpec.from_yaml(
        spec_yaml(
            make_tier("premium", "availability >= 99.9%", default=True),
            window="30d",
            alert_policy={"thresholds": [], "anomalies": {"enabled": False}, **policy},
        )
    )


def _pages(spec: SLOSpec, traffic: Traffic, step: int) -> list[AlertRule]:
    return [r for r in _expected(spec, traffic, step) if r.severity == "critical"]


def test_lone_bad_request_pages_nobody_and_an_outage_pages_within_2_minutes(
    tmp_path: Path,
) -> None:
    spec = _default_policy_spec()
    # 0.05 requests/s (3 a minute) for 6 hours, the last one failed.
    quiet = Traffic((3,) * 359 + (2,), (0,) * 359 + (1,))
    assert not _pages(spec, quiet, 360)
    # 58 minutes at 10 requests/s, then every request failing; checked 2 minutes in, on a
    # whole hour, where the 1d and 3d windows (sums of hourly tiles) are exact too.
    outage = Traffic((600,) * 58 + (0,) * 2, (0,) * 58 + (600,) * 2)
    assert not _pages(spec, outage, 58) and _pages(spec, outage, 60)
    groups = [
        _group("a lone bad request at 0.05/s", spec, quiet, 360),
        _group("an outage at 10/s, 2 minutes in", spec, outage, 60),
    ]
    result = promtool_test_rules(tmp_path, spec, LINKS, groups, STEP_S, "test_burn_guards")
    assert result.returncode == 0, result.stdout + result.stderr


def test_minimum_request_rate_guard(tmp_path: Path) -> None:
    # At 0.05/s, one bad request in ten minutes burns past 14.4x over 1h/5m when the hour
    # held only 6 requests; min_events 1 lets it page, a 0.1/s rate guard does not.
    loose = _default_policy_spec(min_events=1)
    guarded = _default_policy_spec(min_events=1, min_request_rate=0.1)
    sparse = Traffic((0,) * 50 + (1, 0) * 5, (0,) * 59 + (1,))
    assert _pages(loose, sparse, 60) and not _pages(guarded, sparse, 60)
    for name, spec in (("loose", loose), ("guarded", guarded)):
        folder = tmp_path / name
        folder.mkdir()
        groups = [_group(f"one bad of six, {name}", spec, sparse, 60)]
        result = promtool_test_rules(folder, spec, LINKS, groups, STEP_S, "test_burn_guards")
        assert result.returncode == 0, result.stdout + result.stderr


def test_error_budget_exhausted(tmp_path: Path) -> None:
    """99% over a 1h window: 60 bad of 6,000 spends the budget exactly (fires), 59 does not."""
    from alerts.budget_alert import ALERT_NAME, budget_annotations, budget_labels

    tier = DYNAMIC.tiers[0]
    objective = tier.objectives[0]
    groups = []
    for bad in (60, 59):
        bads = (6,) * 10 + (0,) * 50
        bads = (*bads[:9], bad - 54, *bads[10:])
        traffic = Traffic(tuple(100 - b for b in bads), bads)
        expected = (
            [
                {
                    "exp_labels": budget_labels(tier, objective),
                    "exp_annotations": budget_annotations(DYNAMIC, tier, objective, LINKS),
                }
            ]
            if bad == 60
            else []
        )
        groups.append(
            {
                "name": f"{bad} bad of 6000",
                "interval": prom_duration(STEP_S),
                "input_series": availability_series("premium", traffic),
                "alert_rule_test": [
                    {"eval_time": "1h", "alertname": ALERT_NAME, "exp_alerts": expected}
                ],
            }
        )
    result = promtool_test_rules(tmp_path, DYNAMIC, LINKS, groups, STEP_S, "test_burn_guards")
    assert result.returncode == 0, result.stdout + result.stderr
