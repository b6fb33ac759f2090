"""Anomaly bands: the spec's options and opt-outs, and the rules they generate."""

from __future__ import annotations

import re

import pytest

from alerts.anomalies import ALERT_NAME, anomaly_alerts, anomaly_records, signal_expr
from alerts.rules import Links, render_rules
from alerts.runbooks import render_runbooks
from slo.errors import SpecError
from slo.promql import ANOMALY_SIGNAL_RECORD, PHASE_MEAN_RECORD
from slo.sli import PHASES
from slo.spec import SLOSpec
from slo.spec.anomaly_policy import ANOMALY_SIGNALS

TIERS = """
version: 1
tiers:
  - name: premium
    default: true
    objectives: [p95 ttft <= 200ms]
  - name: batch
    objectives: [availability >= 99%]
"""


def _spec(anomalies: str = "") -> SLOSpec:
    return SLOSpec.from_yaml(
        TIERS + (f"alert_policy:\n  anomalies:\n{anomalies}" if anomalies else "")
    )


def _signals(spec: SLOSpec, tier: int) -> list[str]:
    """The signals recorded: a rule's `anomaly` label, or the phases the one rule of every
    phase mean selects (its `phase=~` matcher)."""
    found = []
    for rule in anomaly_records(spec, spec.tiers[tier]):
        if rule.record != ANOMALY_SIGNAL_RECORD:
            continue
        if "anomaly" in rule.labels:
            found.append(rule.labels["anomaly"])
        else:
            phases = re.search(r'phase=~"([^"]*)"', rule.expr)
            assert phases and '"${1}_mean"' in rule.expr, rule.expr
            found += [f"{phase}_mean" for phase in phases.group(1).split("|")]
    return found


def test_every_tier_watches_every_signal_by_default() -> None:
    spec = _spec()
    assert _signals(spec, 0) == list(ANOMALY_SIGNALS) == _signals(spec, 1)
    assert {f"{p}_mean" for p in PHASES} <= set(ANOMALY_SIGNALS)  # queue_prefill too
    alerts = anomaly_alerts(spec, spec.tiers[0], Links())
    assert {a.alert for a in alerts} == {ALERT_NAME}
    assert all(a.labels["severity"] == "info" and a.for_ == "5m" for a in alerts)


def test_spec_opts_tiers_and_signals_out() -> None:
    spec = _spec(
        "    skip:\n      - {tier: batch}\n      - {signal: request_rate}\n"
        "      - {tier: premium, signal: decode_mean}\n"
    )
    assert _signals(spec, 1) == []
    premium = _signals(spec, 0)
    assert "request_rate" not in premium and "decode_mean" not in premium
    assert "prefill_mean" in premium
    assert "batch" not in render_runbooks(spec)[ALERT_NAME].split("| tiers watched |")[1]


def test_disabled_generates_no_anomaly_rules_nor_runbook() -> None:
    spec = _spec("    enabled: false\n")
    assert ALERT_NAME not in render_rules(spec, Links())
    assert ALERT_NAME not in render_runbooks(spec)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("    skip:\n      - {signal: ttft_p50}\n", "unknown anomaly signal 'ttft_p50'"),
        ("    sigma: 3\n", "did you mean 'sigmas'"),
        ("    skip:\n      - {}\n", "a skip entry needs tier, signal or both"),
    ],
)
def test_bad_options_name_the_place_and_the_fix(body: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        _spec(body)


def test_baselines_read_recorded_series_only() -> None:
    spec = _spec()
    records = anomaly_records(spec, spec.tiers[0])
    bands = [r for r in records if r.record and "anomaly_band" in r.record]
    assert bands and all("_bucket" not in r.expr and "_total" not in r.expr for r in bands)
    assert PHASE_MEAN_RECORD in signal_expr("premium", "prefill_mean")
