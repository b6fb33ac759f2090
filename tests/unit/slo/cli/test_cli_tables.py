"""The CLI's terminal tables fit 100 columns, never cut a header, and show only columns that
hold something; the packaged example specs can alert on every objective they set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slo.alert_rules import unreachable
from slo.check.evaluate import evaluate
from slo.check.summary import columns_of
from slo.cli.bench.summary import render_summary
from slo.cli.report.formats import render_text
from slo.records import read_jsonl
from slo.spec import SLOSpec
from tests.helpers.terminal_tables import empty_columns, tables, too_wide

EXAMPLES = Path(__file__).resolve().parents[4] / "slo" / "examples"


def record(index: int, tier: str, **phases: float) -> dict[str, Any]:
    return {
        "request_id": f"r{index}", "timestamp": 1_000.0 + index, "tier": tier,
        "ttft_s": 0.05 + index / 1000, "tpot_s": 0.02, "e2e_s": 1.5 + index / 100,
        "output_tokens": 64, "client_ttft_s": 0.06, "client_e2e_s": 1.6 + index / 100, **phases,
    }  # fmt: skip


def bundled_engine_records() -> list[dict[str, Any]]:
    """Phases as the bundled engine reports them: queue and prefill apart, queue_prefill 0."""
    phases = {"network_s": 0.001, "queue_s": 0.02, "prefill_s": 0.04, "queue_prefill_s": 0.0,
              "decode_s": 1.4, "detokenize_s": 0.003, "other_s": 0.0004}  # fmt: skip
    tiers = ("premium", "standard", "batch")
    return [record(i, tiers[i % 3], **phases) for i in range(30)]


def test_the_summary_fits_and_leaves_out_the_zero_queue_prefill_column() -> None:
    text = render_summary(SLOSpec.default(), columns_of(bundled_engine_records()), 10.0)
    assert too_wide(text) == [] and "…" not in text, text
    assert empty_columns(text) == [], text
    latency, phases = tables(text)
    assert list(latency) == ["tier", "requests", "ok", "TTFT p50", "TTFT p95", "TPOT p95",
                             "e2e p95", "goodput"]  # fmt: skip
    assert list(phases) == ["tier", "queue", "prefill", "decode", "detokenize", "other", "network"]
    assert phases["decode"] == ["1.40 s"] * 3 and phases["other"] == ["0.4 ms"] * 3


def test_an_engine_seen_through_the_wire_shows_queue_prefill_instead() -> None:
    rows = [record(i, "standard", network_s=0.001, queue_prefill_s=0.08, decode_s=1.4)
            for i in range(10)]  # fmt: skip
    text = render_summary(SLOSpec.default(), columns_of(rows), 10.0)
    _, phases = tables(text)
    assert list(phases) == ["tier", "queue+prefill", "decode", "network"], text


def test_the_verdict_tables_of_the_example_run_fit() -> None:
    records = [r.model_dump() for r in read_jsonl(EXAMPLES / "run.jsonl")]
    text = render_text(evaluate(SLOSpec.default(), columns_of(records)))
    assert too_wide(text) == [] and "…" not in text, text
    assert empty_columns(text) == [], text
    assert [len(table) for table in tables(text)] == [7, 7, 7], text


def test_the_alerts_that_would_fire_are_listed_under_their_table() -> None:
    records = bundled_engine_records()
    for slow in records[:30:6]:  # a third of premium's requests take a second to a first token
        slow["client_ttft_s"] = 1.0
    report = evaluate(SLOSpec.default(), columns_of(records))
    text = render_text(report)
    assert too_wide(text) == [] and "…" not in text, text
    firing = [(r.objective.name, alert) for r in report.results for alert in r.alerts]
    assert firing, "the example run should fire an alert for this test to look at"
    for name, alert in firing:
        line = next(line for line in text.splitlines() if f"would fire for {name}:" in line)
        assert alert in line


def test_a_long_objective_wraps_instead_of_being_cut() -> None:
    spec = SLOSpec.from_yaml(
        """
version: 1
tiers:
  - name: a-tier-with-a-rather-long-name
    default: true
    objectives: [99.95% of requests tpot <= 100ms, availability >= 99.95%]
"""
    )
    rows = [record(i, "a-tier-with-a-rather-long-name") for i in range(5)]
    text = render_text(evaluate(spec, columns_of(rows)))
    assert too_wide(text) == [] and "…" not in text, text
    objective = tables(text)[0]["objective"]
    assert len(objective) > 2, f"the objective should have wrapped:\n{text}"
    assert " ".join(cell for cell in objective if cell).startswith(
        "99.95% of requests tpot <= 100ms availability >= 99.95%"
    ), text


@pytest.mark.parametrize("name", ["slo.yaml", "overload.yaml", "openslo.yaml", "regression.yaml"])
def test_every_objective_of_the_packaged_specs_can_be_alerted_on(name: str) -> None:
    assert unreachable(SLOSpec.load(EXAMPLES / name)) == []
