from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from slo.errors import UsageError
from slo.spec import SLOSpec, SpecError
from slo.units import format_duration, parse_duration, parse_fraction

EXAMPLES = Path(__file__).resolve().parents[3] / "slo" / "examples"

GOOD = """\
version: 1
window: 7d
tiers:
  - name: premium
    priority: 0
    match: {header: X-LLM-Tier, values: [premium, gold], api_keys: [key-1]}
    objectives:
      - p95 ttft <= 200ms
      - 99% of requests e2e <= 30s
      - availability >= 99.9%
      - goodput >= 90%
  - name: standard
    default: true
    match: {routes: ["/v1/chat/*", /v1/completions]}
    objectives: [p95 ttft <= 500ms]
"""


def test_good_spec_loads_with_defaults_filled_in() -> None:
    spec = SLOSpec.from_yaml(GOOD)
    assert [tier.name for tier in spec.tiers] == ["premium", "standard"]
    assert spec.window_s == 7 * 86400
    assert spec.default_tier.name == "standard"
    premium = spec.tier("premium")
    assert premium.priority == 0 and spec.tier("standard").priority == 1
    names = [objective.name for objective in premium.objectives]
    assert names == [
        "p95 ttft <= 200ms", "99% of requests e2e <= 30s", "availability >= 99.9%",
        "goodput >= 90%",
    ]  # fmt: skip
    assert premium.objectives[0].threshold_s == pytest.approx(0.2)
    assert premium.objectives[1].form == "ratio" and premium.objectives[1].target == 0.99
    assert [rule.factor for rule in spec.alert_policy.burn_rates] == [14.4, 6.0, 3.0, 1.0]
    assert spec.alert_policy.min_events == 10


def test_normalized_spec_round_trips() -> None:
    for spec in (SLOSpec.from_yaml(GOOD), SLOSpec.default()):
        text = yaml.safe_dump(spec.to_dict(), sort_keys=False)
        assert SLOSpec.from_yaml(text).to_dict() == spec.to_dict()


def test_example_spec_has_the_three_industry_tiers() -> None:
    spec = SLOSpec.default()
    assert [tier.name for tier in spec.tiers] == ["premium", "standard", "batch"]
    assert "p95 ttft <= 200ms" in [o.name for o in spec.tier("premium").objectives]
    assert "p95 ttft <= 500ms" in [o.name for o in spec.tier("standard").objectives]
    assert "p99 e2e <= 20s" in [o.name for o in spec.tier("batch").objectives]


@pytest.mark.parametrize(
    ("headers", "route", "api_key", "tier"),
    [
        ({"x-llm-tier": "gold"}, "/v1/embeddings", None, "premium"),
        ({"X-LLM-TIER": "premium"}, "/", None, "premium"),
        ({}, "/x", "key-1", "premium"),
        ({}, "/v1/chat/completions", None, "standard"),
        ({"x-llm-tier": "bronze"}, "/other", "key-2", "standard"),
    ],
)
def test_resolve_tier(headers: dict[str, str], route: str, api_key: str | None, tier: str) -> None:
    assert SLOSpec.from_yaml(GOOD).resolve_tier(headers, route, api_key).name == tier


def test_route_prefix_matches_whole_segments_only() -> None:
    spec = SLOSpec.default()
    assert spec.resolve_tier({}, "/v1/batch/jobs").name == "batch"
    assert spec.resolve_tier({}, "/v1/batchy").name == "standard"


MALFORMED = {
    "unknown SLI": (
        "tiers:\n- name: gold\n  objectives:\n  - p95 ttfb <= 200ms\n",
        4, "gold", r"unknown SLI 'ttfb'; did you mean 'ttft'\?",
    ),
    "threshold without unit": (
        "tiers:\n- name: gold\n  objectives:\n  - p95 ttft <= 200\n",
        4, "gold", r"has no unit; write it with one, e\.g\. 200ms",
    ),
    "duplicate tier": (
        "tiers:\n- name: gold\n  objectives: [p95 ttft <= 1s]\n"
        "- name: gold\n  default: true\n  objectives: [p95 ttft <= 2s]\n",
        4, "gold", r"duplicate tier \(first defined on line 2\); rename one",
    ),
    "two defaults": (
        "tiers:\n- name: a\n  default: true\n  objectives: [p95 ttft <= 1s]\n"
        "- name: b\n  default: true\n  objectives: [p95 ttft <= 2s]\n",
        5, "b", r"second default tier .*keep 'default: true' on one tier only",
    ),
    "bad YAML": (
        "tiers:\n- name: a\n  objectives: [p95 ttft <= 1s\n",
        4, None, r"invalid YAML: .*; check the indentation",
    ),
    "duplicate key": (
        "tiers:\n- name: a\n  objectives: [p95 ttft <= 1s]\n  objectives: [p95 ttft <= 2s]\n",
        4, None, r"duplicate key 'objectives' \(first on line 3\)",
    ),
    "no objectives": ("tiers:\n- name: a\n  objectives: []\n", 3, "a", r"has no objectives; add"),
    "no default among many": (
        "tiers:\n- name: a\n  objectives: [p95 ttft <= 1s]\n"
        "- name: b\n  objectives: [p95 ttft <= 1s]\n",
        1, None, r"no tier has 'default: true'",
    ),
    "misspelled key": (
        "tiers:\n- name: a\n  objectivs: [p95 ttft <= 1s]\n", 3, "a", r"did you mean 'objectives'",
    ),
    "not a latency SLI": (
        "tiers:\n- name: a\n  objectives: [p95 input_tokens <= 1s]\n", 3, "a", r"not a latency",
    ),
    "bad window": ("window: 30\ntiers:\n- name: a\n  objectives: [p95 ttft <= 1s]\n", 1, None,
                   r"window: duration 30 has no unit"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_spec_gives_one_line_with_file_line_and_fix(case: str) -> None:
    text, line, tier, pattern = MALFORMED[case]
    with pytest.raises(SpecError) as caught:
        SLOSpec.from_yaml(text, source="slo.yaml")
    message = str(caught.value)
    assert "\n" not in message
    prefix = f"slo.yaml:{line}: " + (f"tier {tier!r}: " if tier else "")
    assert message.startswith(prefix), message
    assert re.search(pattern, message), message
    assert isinstance(caught.value, UsageError)


def test_missing_file_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"nope\.yaml: file not found; `slo init`"):
        SLOSpec.load(tmp_path / "nope.yaml")


def _spec_texts() -> st.SearchStrategy[str]:
    words = st.sampled_from(
        ["tiers:", "- name: a", "  objectives:", "  - p95 ttft <= 1s", "  default: true",
         "window: 3d", "  priority: x", "  match: {header: 1}", "- p99 e2e < 2", "alert_policy: 3",
         "  - 99% of requests tpot <= 5ms", ": :", "[", "  - {sli: ttft}", "min_events: 0", "\t",
         "apiVersion: openslo/v1", "kind: SLO", "spec:", "  objectives: [{target: x}]",
         "  indicatorRef: y", "  timeWindow: [3]", "---", "  indicator: {spec: {ratioMetric: 1}}"]
    )  # fmt: skip
    structured = st.lists(words, max_size=12).map("\n".join)
    return st.one_of(st.text(max_size=200), structured)


@settings(max_examples=300, deadline=None)
@given(_spec_texts())
def test_fuzzed_specs_load_or_fail_with_one_line(text: str) -> None:
    try:
        SLOSpec.from_yaml(text, source="fuzz.yaml")
    except SpecError as error:
        message = str(error)
        assert message.startswith("fuzz.yaml")
        assert "\n" not in message


def test_openslo_readme_example_imports() -> None:
    spec = SLOSpec.load(EXAMPLES / "openslo.yaml")
    objectives = [o.name for o in spec.default_tier.objectives]
    assert objectives == ["availability >= 98%", "95% of requests ttft <= 500ms"]
    assert spec.window_s == 28 * 86400
    assert any("read as availability" in note for note in spec.notes)


def test_openslo_timeslices_are_refused_with_the_reason() -> None:
    text = (
        (EXAMPLES / "openslo.yaml")
        .read_text()
        .replace("budgetingMethod: Occurrences", "budgetingMethod: Timeslices")
    )
    with pytest.raises(UsageError, match=r"Timeslices.*use Occurrences"):
        SLOSpec.from_yaml(text, source="o.yaml")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("200ms", 0.2), ("1.5s", 1.5), ("30d", 2592000.0), ("5m", 300.0), ("250us", 0.00025)],
)
def test_durations_parse_and_format(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)


def test_fractions() -> None:
    assert parse_fraction("99.9%") == pytest.approx(0.999)
    assert parse_fraction(0.95) == 0.95
    with pytest.raises(ValueError, match="between 0% and 100%"):
        parse_fraction("100%")
