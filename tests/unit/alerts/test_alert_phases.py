"""The phase to blame: every latency alert carries `phase`, computed from per-tier phase
records; every phase of the catalog has a runbook section; the annotation's text is what its
Go template expands to (the generated promtool tests check the expansion itself)."""

from __future__ import annotations

import re

import pytest

from alerts.phase_guide import guide, guides
from alerts.phases import phase_annotation, phase_records, phase_text
from alerts.rules import Links, alert_annotations, alert_expr, shown_annotations
from alerts.runbooks import render_runbooks
from slo.alert_rules import UNATTRIBUTED, alert_rules, phases_of
from slo.promql import BLAMED_PHASE_RECORD, PHASE_MEAN_RECORD
from slo.sli import CATALOG, PHASES
from slo.spec import SLOSpec

SPEC = SLOSpec.default()


def test_every_phase_belongs_to_ttft_or_tpot_and_all_to_e2e() -> None:
    assert set(phases_of("ttft")) | set(phases_of("tpot")) == set(PHASES)
    assert not set(phases_of("ttft")) & set(phases_of("tpot"))
    assert "queue_prefill" in phases_of("ttft")
    assert phases_of("e2e") == PHASES
    assert phases_of("availability") == ()


def test_every_latency_alert_joins_the_blamed_phase() -> None:
    for rule in alert_rules(SPEC):
        expr = alert_expr(rule)
        if rule.kind == "absent" or rule.sli == "availability":
            assert BLAMED_PHASE_RECORD not in expr
            assert "phase" not in alert_annotations(rule, SPEC, Links())
        else:
            assert BLAMED_PHASE_RECORD in expr and f'"{UNATTRIBUTED}"' in expr, rule
            assert rule.labels_with_phase("prefill")["phase"] == "prefill"
            assert "phase" not in rule.labels  # a static label would override the expression's


def test_phase_records_cover_every_phase_of_every_tier() -> None:
    for tier in SPEC.tiers:
        # One rule records every phase's mean, each part labelled with its phase and reading
        # that phase's own histogram.
        (means,) = [r for r in phase_records(tier) if r.record == PHASE_MEAN_RECORD]
        parts = means.expr.split("\nor\n")
        assert [re.findall(r'"phase", "(\w+)", "", ""', part) for part in parts] == [
            [phase] for phase in PHASES
        ]
        for phase, part in zip(PHASES, parts, strict=True):
            metric = CATALOG[phase].metric
            assert f"{metric}_sum" in part and f"{metric}_count" in part
        assert all(r.labels["tier"] == tier.name for r in phase_records(tier))


def test_annotation_text_matches_its_template() -> None:
    template = phase_annotation()
    text = phase_text("prefill", (0.2941176, 0.17241))
    assert text == (
        "prefill grew most: 29.41% of the mean e2e over the last 5m, "
        "17.24% over the 1h that ended 1h ago."
    )
    # Static parts of the text appear verbatim in the template.
    for part in (" grew most: ", " of the mean e2e over the last 5m, ", " over the "):
        assert part in template
    rule = next(r for r in alert_rules(SPEC) if r.sli == "ttft")
    shown = shown_annotations(rule, SPEC, Links())
    assert shown["phase"] == phase_text(UNATTRIBUTED, None)


def test_runbook_of_a_latency_alert_has_a_section_per_phase_it_may_blame() -> None:
    pages = render_runbooks(SPEC)
    ttft = pages["LLMSLOTTFTBudgetBurn"]
    for phase in phases_of("ttft"):
        assert f"### {phase}\n" in ttft
    assert "### decode\n" not in ttft
    assert "### queue_prefill\n" in pages["LLMSLOE2EBudgetBurn"]
    assert len(guides()) == len(PHASES)


def test_a_phase_without_a_guide_fails_naming_the_fix() -> None:
    with pytest.raises(KeyError, match=r"alerts/phase_guide\.py: phase 'warp'"):
        guide("warp")


def test_readme_example_alert_is_the_generated_one() -> None:
    from pathlib import Path

    from alerts.phase_tests import example_alert

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    assert f"```text\n{example_alert(SPEC, Links())}\n```" in readme
