"""One fact, one place: every list that restates the SLI catalog (`slo.sli`), the record's
fields (`RequestRecord.model_fields`) or the phases agrees with its source.

Each test walks the source and asks the real consumer (prometheus_client registry, live
windows, dashboard panels, record validation, the record the middleware writes), so a latency
SLI added to the catalog is checked end to end here without a line of this file changing.
The engine's copy of the shed reasons is checked in tests/unit/engine/test_policies.py
(importing the engine pulls in torch).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from dashboards.genai_row import TITLE as GENAI_TITLE
from dashboards.panels import LATENCY_PANELS, rows
from middleware import ScriptedClock
from middleware.live import BREAKDOWN_FIELD, TierWindows, breakdown_fields
from middleware.metrics.metric_set import PER_REQUEST, REQUEST_HISTOGRAMS, MetricSet
from middleware.request.reporting import record_fields, server_timing_value, timings_comment
from middleware.request.timeline import Breakdown, RequestTimeline
from slo.genai import (
    INSTRUMENTS,
    REQUEST_DURATION,
    TIME_PER_OUTPUT_TOKEN,
    TIME_TO_FIRST_TOKEN,
    USAGE_INPUT_TOKENS,
    USAGE_OUTPUT_TOKENS,
)
from slo.records import (
    BLAME_FIELDS,
    BOOL_FIELDS,
    FIELD_NAMES,
    INT_FIELDS,
    LIST_FIELDS,
    OPTIONAL_FLOAT,
    OPTIONAL_STR,
    REQUIRED_FLOAT,
    REQUIRED_STR,
    RecordError,
    RequestRecord,
    validate_record,
)
from slo.sli import (
    CATALOG,
    LATENCY_FIELDS,
    LATENCY_SLIS,
    PER_REQUEST_LATENCY_SLIS,
    PHASE_FIELDS,
    PHASES,
    SHED_REASONS,
)
from slo.spec import SLOSpec
from tests.helpers.measured import settled_request

ROUTE = "/v1/chat/completions"
GAPS = 3  # inter-token gaps in the breakdown fed below


def _threshold_ms(index: int) -> float:
    # Distinct per SLI and off every catalog default bucket: a value read from the wrong field
    # lands in another bucket, or is another sum.
    return round(113.7 + 17.3 * index, 1)


SPEC = SLOSpec.from_yaml(
    "tiers:\n  - name: gold\n    objectives:\n"
    + "".join(
        f"      - p95 {name} <= {_threshold_ms(index)}ms\n"
        for index, name in enumerate(LATENCY_SLIS)
    )
)
THRESHOLD_S = {o.sli: o.threshold_s for o in SPEC.tiers[0].objectives}


def _breakdown() -> Breakdown:
    """A breakdown whose every latency SLI sits exactly on its own objective's threshold."""
    values: dict[str, Any] = {"output_tokens": GAPS + 1, "tokens_source": "usage"}
    for name, field in LATENCY_FIELDS.items():
        value = THRESHOLD_S[name]
        values[field] = (value,) * GAPS if CATALOG[name].per_token_gap else value
    return Breakdown(**values)


def _exported_name(metric: str, kind: str) -> str:
    return metric.removesuffix("_total") if kind == "counter" else metric


def test_every_catalog_metric_is_created_with_its_kind_and_nothing_else() -> None:
    registry = CollectorRegistry()
    MetricSet(SPEC, "tiny", registry, routes=(ROUTE,))
    created = {m.name: m.type for m in registry.collect()}
    expected = {_exported_name(s.metric, s.kind): s.kind for s in CATALOG.values()}
    assert created == expected


def test_shed_counter_has_a_child_per_shed_reason() -> None:
    registry = CollectorRegistry()
    MetricSet(SPEC, "tiny", registry)
    shed = _exported_name(CATALOG["shed"].metric, "counter")
    reasons = {
        sample.labels["reason"]
        for metric in registry.collect()
        if metric.name == shed
        for sample in metric.samples
    }
    assert reasons == set(SHED_REASONS)


def test_request_histograms_are_the_catalog_histograms_with_request_labels() -> None:
    per_token = {name for name in LATENCY_SLIS if CATALOG[name].per_token_gap}
    assert set(REQUEST_HISTOGRAMS) == set(PER_REQUEST_LATENCY_SLIS)
    assert set(REQUEST_HISTOGRAMS) | per_token == set(LATENCY_SLIS)
    request_histograms = {
        s.name
        for s in CATALOG.values()
        if s.kind == "histogram" and s.labels == CATALOG["ttft"].labels
    }
    assert {*PER_REQUEST, *per_token} == request_histograms


def test_each_latency_histogram_is_fed_from_its_own_field() -> None:
    registry = CollectorRegistry()
    metrics = MetricSet(SPEC, "tiny", registry, routes=(ROUTE,))
    breakdown = _breakdown()
    metrics.observe(settled_request("gold", ROUTE, input_tokens=7), breakdown, trace_id=None)
    for name in LATENCY_SLIS:
        metric = CATALOG[name].metric
        labels = {"tier": "gold", "model": "tiny", "route": ROUTE}
        total = registry.get_sample_value(f"{metric}_sum", labels)
        count = registry.get_sample_value(f"{metric}_count", labels)
        value = getattr(breakdown, LATENCY_FIELDS[name])
        expected = sum(value) if isinstance(value, tuple) else value
        assert total == pytest.approx(expected), name
        assert count == (GAPS if CATALOG[name].per_token_gap else 1), name


def test_live_windows_count_every_latency_sli_from_its_own_field() -> None:
    tier = SPEC.tiers[0]
    windows = TierWindows(SPEC, tier, [3600.0])
    assert set(windows.layout.histogram_start) == set(LATENCY_SLIS)
    windows.observe(1000.0, "ok", _breakdown())
    totals = windows.totals(3600.0, 1000.0)
    for objective in tier.objectives:
        sli = objective.sli or ""
        events = GAPS if CATALOG[sli].per_token_gap else 1
        assert windows.events_and_good(objective, totals) == (events, events), sli
        # The value sits on its threshold, a boundary: the first bucket holding it is that one.
        first = next(bound for bound, count in windows.cumulative_buckets(sli, totals) if count)
        assert first == THRESHOLD_S[sli], sli


def test_live_phase_sums_follow_the_phases() -> None:
    windows = TierWindows(SPEC, SPEC.tiers[0], [3600.0])
    breakdown = _breakdown()
    windows.observe(1000.0, "ok", breakdown)
    totals = windows.totals(3600.0, 1000.0)
    start = windows.layout.phase_start
    assert list(totals[start : start + len(PHASES)]) == pytest.approx(
        list(breakdown.phases.values())
    )
    assert totals[start + len(PHASES)] == 1  # ok requests summed


def test_live_map_is_derived_and_fails_loudly_on_what_it_cannot_count() -> None:
    assert {name: LATENCY_FIELDS[name] for name in PER_REQUEST_LATENCY_SLIS} == BREAKDOWN_FIELD
    with pytest.raises(TypeError, match="'cold_start'"):
        breakdown_fields(("cold_start",))
    tier = SPEC.tiers[0]
    stray = dataclasses.replace(tier.objectives[0], sli="input_tokens")
    with pytest.raises(ValueError, match=r"tier 'gold'.*'input_tokens'"):
        TierWindows(SPEC, dataclasses.replace(tier, objectives=(stray,)), [3600.0])


def test_dashboard_charts_every_latency_sli_and_names_only_catalog_metrics() -> None:
    panels = [panel for row in rows(SPEC) for panel in row.panels]
    exprs = "\n".join(target.expr for panel in panels for target in panel.targets)
    assert set(LATENCY_PANELS) == set(LATENCY_SLIS) - set(PHASES)
    for name in LATENCY_SLIS:
        assert CATALOG[name].metric in exprs, name
    (stacked,) = [panel for panel in panels if panel.stacked]
    assert [target.legend for target in stacked.targets] == list(PHASES)
    known = {_exported_name(s.metric, s.kind) for s in CATALOG.values()}
    named = set(re.findall(r"\bllm_slo_[a-z0-9_]+\b(?!:)", exprs))
    suffixes = ("_bucket", "_sum", "_count", "_total")
    assert {re.sub("(" + "|".join(suffixes) + ")$", "", n) for n in named} <= known


def test_dashboard_names_only_the_cores_gen_ai_series_and_labels() -> None:
    all_rows = rows(SPEC)
    exprs = "\n".join(t.expr for row in all_rows for panel in row.panels for t in panel.targets)
    series = {name for instrument in INSTRUMENTS for name in instrument.prometheus_series}
    labels = {label for instrument in INSTRUMENTS for label in instrument.prometheus_labels}
    # A metric is the name a selector opens with; a label is one a query groups by.
    selected = set(re.findall(r"\b(gen_ai_[a-z0-9_]+)\{", exprs))
    grouped = {
        label.strip()
        for clause in re.findall(r"\bby \(([^)]*)\)", exprs)
        for label in clause.split(",")
        if label.strip().startswith("gen_ai_")
    }
    assert selected <= series, selected - series
    assert grouped <= labels, grouped - labels
    assert set(re.findall(r"\bgen_ai_[a-z0-9_]+\b", exprs)) == selected | grouped
    # The GenAI row charts the three server histograms and both token usage counters.
    (row,) = [row for row in all_rows if row.title == GENAI_TITLE]
    charted = {
        name.removesuffix("_bucket")
        for panel in row.panels
        for target in panel.targets
        for name in re.findall(r"\b(gen_ai_[a-z0-9_]+)\{", target.expr)
    }
    wanted = (TIME_TO_FIRST_TOKEN, REQUEST_DURATION, TIME_PER_OUTPUT_TOKEN)
    wanted += (USAGE_INPUT_TOKENS, USAGE_OUTPUT_TOKENS)
    assert {instrument.prometheus_name for instrument in wanted} <= charted
    # The row's notes name every gen_ai series and the catalog series that measures the same.
    notes = "\n".join(row.notes)
    for instrument in INSTRUMENTS:
        assert instrument.prometheus_name in notes, instrument.name
        if instrument.counterpart is not None:
            assert instrument.counterpart in CATALOG, instrument.name
            assert CATALOG[instrument.counterpart].metric in notes, instrument.name


def test_record_field_groups_partition_the_model_fields() -> None:
    assert tuple(name for name in RequestRecord.model_fields if name != "id") == FIELD_NAMES
    groups = (
        REQUIRED_STR, OPTIONAL_STR, REQUIRED_FLOAT, OPTIONAL_FLOAT, INT_FIELDS, BOOL_FIELDS,
        LIST_FIELDS, BLAME_FIELDS,
    )  # fmt: skip
    assert sorted(name for group in groups for name in group) == sorted(FIELD_NAMES)
    required = {n for n, info in RequestRecord.model_fields.items() if info.is_required()}
    assert set(REQUIRED_STR) | set(REQUIRED_FLOAT) == required


def test_every_catalog_record_field_is_a_record_field_of_its_type() -> None:
    for sli in CATALOG.values():
        if sli.record_field is not None:
            assert sli.record_field in FIELD_NAMES, sli.name
    for name, field in LATENCY_FIELDS.items():
        kind = LIST_FIELDS if CATALOG[name].per_token_gap else (*REQUIRED_FLOAT, *OPTIONAL_FLOAT)
        assert field in kind, name
    # Validation reads every field: a latency value that is no number is refused by name.
    for field in LATENCY_FIELDS.values():
        bad = {"request_id": "r", "tier": "gold", "timestamp": 1.0, "e2e_s": 1.0, field: "x"}
        with pytest.raises(RecordError, match=f"field '{field}'"):
            validate_record(bad)


def test_record_the_middleware_writes_has_every_field_from_its_source() -> None:
    timeline = RequestTimeline.begin("r1", ScriptedClock())
    breakdown = _breakdown()
    ok = settled_request("gold", ROUTE, "ok", status=200, stream=True, timeline=timeline)
    produced = record_fields(ok, breakdown, "tiny", "t1", produced=True)
    assert tuple(produced) == FIELD_NAMES
    for field in (f.name for f in dataclasses.fields(Breakdown)):
        value = getattr(breakdown, field)
        assert produced[field] == (list(value) if isinstance(value, tuple) else value), field
    validate_record(produced)  # the store's own check takes it
    shed = settled_request("gold", ROUTE, "shed", status=429, stream=False, timeline=timeline)
    refused = record_fields(shed, breakdown, "tiny", None, produced=False)
    assert tuple(refused) == FIELD_NAMES
    for name, field in LATENCY_FIELDS.items():
        kept = name == "e2e" or name in PHASES  # the timeline's cuts; nothing about tokens
        assert (refused[field] is not None) == kept, name


def test_phases_agree_everywhere() -> None:
    assert tuple(LATENCY_FIELDS[phase] for phase in PHASES) == PHASE_FIELDS
    breakdown = _breakdown()
    assert tuple(breakdown.phases) == PHASES
    # `phase_seconds` names its fields one by one: each value is its own phase's field, in
    # PHASE_FIELDS order, an unknown (None) one as 0.
    distinct = dataclasses.replace(
        breakdown, **{field: 0.001 * (place + 1) for place, field in enumerate(PHASE_FIELDS)}
    )
    assert distinct.phase_seconds == tuple(getattr(distinct, field) for field in PHASE_FIELDS)
    unknown = dataclasses.replace(distinct, queue_s=None, prefill_s=None, queue_prefill_s=None)
    assert unknown.phase_seconds == tuple(getattr(unknown, f) or 0.0 for f in PHASE_FIELDS)
    assert unknown.phases == dict(zip(PHASES, unknown.phase_seconds, strict=True))
    assert [part.split(";")[0] for part in server_timing_value(breakdown).split(", ")] == [
        *PHASES,
        "ttft",
        "e2e",
    ]
    comment = timings_comment(breakdown).decode()
    assert re.findall(r'"(\w+)":', comment)[: len(PHASES)] == list(PHASE_FIELDS)
