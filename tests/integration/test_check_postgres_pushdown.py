"""`slo check --db postgresql://...` counts in SQL: the same report as the numpy path, exactly.

Each test writes records to a real PostgreSQL (`.ci/run` starts one and sets the URL), in a
schema of its own (other tests empty the default table), then compares `evaluate_sql` with
`evaluate` over the store's columns: every count, percentile, burn rate, alert and note.
Whatever bounds the sample gives (it only decides how many values are sorted), the report is
the same: tests hand the check crafted bounds, and take the large-table path on a small table.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from slo.check import sql_check, sql_ranks, sql_scan
from slo.check.evaluate import columns_needed, evaluate
from slo.check.sql_check import evaluate_sql
from slo.errors import UsageError
from slo.records import validate_record
from slo.spec import SLOSpec
from slo.store import TABLE, RecordStore
from tests.helpers.postgres import postgres_schema
from tests.helpers.record_samples import START, sample_records

pytestmark = pytest.mark.integration

# Boundaries on purpose: thresholds that sample values sit exactly on (< and <=), an ITL
# objective, goodput after some latency objectives and before another, throughput.
SPEC = """
window: 1d
min_events: 1
tiers:
  - name: premium
    default: true
    objectives:
      - p95 ttft <= {ttft}
      - 90% of requests tpot < 40ms
      - goodput >= 90%
      - p99 e2e <= 2s
      - p90 itl <= 30ms
      - availability >= 99%
  - name: standard
    objectives: [p50 ttft < {ttft}, availability >= 97%, throughput >= 10 tokens/s]
  - name: batch
    objectives: [p99 e2e <= 30s, 99% of gaps itl < 40ms, goodput >= 99%]
"""


@pytest.fixture
def schema_url() -> Iterator[str]:
    with postgres_schema("check") as url:
        yield url


def both(url: str, spec: SLOSpec, now: float) -> tuple[dict[str, Any], dict[str, Any]]:
    store = RecordStore(url)
    try:
        pushed = evaluate_sql(spec, store.engine, now).to_dict()
        columns = store.columns(since=now - spec.window_s, columns=columns_needed(spec))
        pulled = evaluate(spec, columns, now=now).to_dict()
    finally:
        store.close()
    return pushed, pulled


def store_records(url: str, records: list[dict[str, Any]]) -> None:
    store = RecordStore(url)
    try:
        store.add_many(validate_record(record) for record in records)
    finally:
        store.close()


def test_same_report_as_numpy_on_mixed_records(schema_url: str) -> None:
    records = sample_records(3000, seed=3)
    # Client-side gaps in one tier only: that tier is then judged on the client view.
    for index, record in enumerate(records):
        if record["tier"] == "batch" and index % 11 == 0:
            record["client_itl_s"] = [0.04, 0.039, 0.041][: 1 + index % 3]
    records.append(records[0] | {"request_id": "stray", "tier": "unknown-tier"})
    records.append(records[1] | {"request_id": "late", "timestamp": START + 10})  # after now
    records.append(
        records[2] | {"request_id": "late-stray", "tier": "late-tier", "timestamp": START + 10}
    )
    store_records(schema_url, records)
    ttft = sorted(r["ttft_s"] for r in records if r["tier"] == "premium")[500]
    spec = SLOSpec.from_yaml(SPEC.format(ttft=f"{ttft * 1000}ms"))
    pushed, pulled = both(schema_url, spec, now=START + 3)
    assert pushed == pulled
    assert pulled["notes"] and pulled["records"] == 3001  # the late one left out, noted
    premium = {o["objective"]: o for o in pulled["tiers"][0]["objectives"]}
    assert premium["p90 itl <= 30ms"]["events"] > 0
    batch = {o["objective"]: o for o in pulled["tiers"][2]["objectives"]}
    assert batch["99% of gaps itl < 40ms"]["client_view_events"] > 0


@pytest.mark.parametrize("good", [998, 999, 1000])
def test_good_count_exactly_at_target(schema_url: str, good: int) -> None:
    """999 of 1000 at 99.9%: met; 998: violated; values exactly on the threshold are good."""
    records = []
    for index in range(1000):
        ttft = 0.2 if index < good else 0.2000001  # exactly at the threshold, or just over
        records.append({"request_id": f"r{index}", "tier": "premium", "timestamp": START + index,
                        "e2e_s": 1.0, "ttft_s": ttft, "output_tokens": 5})  # fmt: skip
    store_records(schema_url, records)
    spec = SLOSpec.from_yaml(
        "tiers:\n- name: premium\n  default: true\n"
        "  objectives: [99.9% of requests ttft <= 200ms, p99.9 ttft <= 200ms, p99.9 ttft < 200ms]\n"
    )
    pushed, pulled = both(schema_url, spec, now=START + 2000)
    assert pushed == pulled
    verdicts = [o["verdict"] for o in pulled["tiers"][0]["objectives"]]
    expected = "met" if good >= 999 else "violated"
    assert verdicts == [expected, expected, "violated"]


def test_empty_store_and_bad_url(schema_url: str) -> None:
    pushed, pulled = both(schema_url, SLOSpec.default(), now=START)
    assert pushed == pulled
    store = RecordStore(schema_url)
    try:
        store.engine.dispose()
        broken = create_engine(schema_url.replace("llm_slo:llm_slo@", "llm_slo:wrong@"))
        with pytest.raises(UsageError, match="cannot read records from"):
            evaluate_sql(SLOSpec.default(), broken, now=START)
    finally:
        store.close()


# --- the sampled bounds decide the work, never the answer ----------------------------------

VALUE_FIELDS = ("ttft_s", "tpot_s", "e2e_s")
CLIENT_OF = {"ttft_s": "client_ttft_s", "e2e_s": "client_e2e_s", "tpot_s": "client_tpot_s"}


def judged_values(records: list[dict[str, Any]], tier: str, name: str) -> list[float]:
    """A tier's ok values of one SLI, client view first, sorted (as a percentile reads them)."""
    values = []
    for record in records:
        if record["tier"] == tier and record["outcome"] == "ok":
            value = record.get(CLIENT_OF[name], record.get(name))
            if value is not None:
                values.append(value)
    return sorted(values)


def crafted_bounds(records: list[dict[str, Any]], style: str) -> dict[tuple[str, str], tuple]:
    """Bounds as a sample could give them: around the ranks, far off them (the rank falls in
    an outer region), on repeated values, or outside every value."""
    found = {}
    for tier in ("premium", "standard", "batch"):
        for name in VALUE_FIELDS:
            values = judged_values(records, tier, name)
            n = len(values)
            if style == "around":
                picks = [values[int(n * q)] for q in (0.44, 0.52, 0.88, 0.91, 0.94, 0.96, 0.985)]
            elif style == "off":
                picks = [values[int(n * 0.2)], values[int(n * 0.3)]]  # every rank above both
            elif style == "many":
                picks = values[::7]  # ties: sample values are rounded to the microsecond
            else:
                picks = [values[0] / 2, values[-1] * 2]
            found[(tier, name)] = tuple(sorted(set(picks)))
    return found


@pytest.mark.parametrize("style", ["around", "off", "many", "outside"])
def test_any_bounds_give_the_same_report(
    schema_url: str, monkeypatch: pytest.MonkeyPatch, style: str
) -> None:
    records = sample_records(3000, seed=5)
    store_records(schema_url, records)
    ttft = judged_values(records, "premium", "ttft_s")[500]
    spec = SLOSpec.from_yaml(SPEC.format(ttft=f"{ttft * 1000}ms"))
    bounds = crafted_bounds(records, style)
    monkeypatch.setattr(sql_check, "_bounds", lambda *args: bounds)
    pushed, pulled = both(schema_url, spec, now=START + 3)
    assert pushed == pulled
    assert all(tier["objectives"][0]["observed_s"] is not None for tier in pulled["tiers"])


def test_sampled_bounds_jit_and_wide_keys(schema_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The path a large table takes (sample, JIT, bigint keys), on a small one."""
    records = sample_records(6000, seed=7)
    store_records(schema_url, records)
    store = RecordStore(schema_url)
    try:
        with store.engine.connect() as connection:
            connection.execution_options(isolation_level="AUTOCOMMIT").execute(
                text(f"ANALYZE {TABLE.name}")  # reltuples: the sample's size
            )
    finally:
        store.close()
    monkeypatch.setattr(sql_check, "SAMPLE_MIN_TABLE", 0)
    monkeypatch.setattr(sql_check, "JIT_MIN_TABLE", 0)
    monkeypatch.setattr(sql_scan, "INT4_KEYS", 0)
    monkeypatch.setattr(sql_ranks, "SAMPLE_MIN_VALUES", 50)
    seen: list[dict[tuple[str, str], tuple]] = []
    real = sql_ranks.sample_bounds

    def spy(*args: Any) -> dict[tuple[str, str], tuple]:
        seen.append(real(*args))
        return seen[-1]

    monkeypatch.setattr(sql_check, "sample_bounds", spy)
    spec = SLOSpec.from_yaml(SPEC.format(ttft="150ms"))
    pushed, pulled = both(schema_url, spec, now=START + 7)
    assert pushed == pulled
    assert seen and len(seen[0]) >= 6, "the sample gave no bounds: the test took another path"
