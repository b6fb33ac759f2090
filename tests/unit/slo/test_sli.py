from __future__ import annotations

import pytest

from slo.sli import CATALOG, LATENCY_SLIS, OUTCOMES, STANDARD_LABELS, buckets_for
from slo.spec import SLOSpec

REQUIRED = (
    "ttft", "tpot", "itl", "e2e", "queue", "prefill", "queue_prefill", "decode", "detokenize",
        "network", "other",
    "input_tokens", "output_tokens", "requests", "throughput", "cold_start", "queue_depth",
    "running", "batch_size", "kv_usage", "gpu_utilization", "gpu_memory", "prefix_cache_hits",
    "spec_decode_accepted_tokens",
)  # fmt: skip


def test_catalog_names_every_required_sli_once_with_prefixed_unique_metrics() -> None:
    assert set(REQUIRED) <= set(CATALOG)
    metrics = [sli.metric for sli in CATALOG.values()]
    assert len(metrics) == len(set(metrics))
    assert all(metric.startswith("llm_slo_") for metric in metrics)
    assert CATALOG["ttft"].metric == "llm_slo_time_to_first_token_seconds"


def test_counters_end_in_total_and_histograms_of_time_end_in_seconds() -> None:
    for sli in CATALOG.values():
        if sli.kind == "counter":
            assert sli.metric.endswith("_total"), sli.name
        if sli.kind == "histogram" and sli.unit == "seconds":
            assert sli.metric.endswith("_seconds"), sli.name
            assert list(sli.default_buckets) == sorted(sli.default_buckets)


def test_outcome_label_only_on_the_requests_counter() -> None:
    with_outcome = [sli.name for sli in CATALOG.values() if "outcome" in sli.labels]
    assert with_outcome == ["requests"]
    assert CATALOG["ttft"].labels == STANDARD_LABELS
    assert OUTCOMES[0] == "ok" and len(OUTCOMES) == 7


def test_latency_slis_map_to_record_fields() -> None:
    assert set(LATENCY_SLIS) == {
        "ttft", "tpot", "itl", "e2e", "queue", "prefill", "queue_prefill", "decode", "detokenize",
        "network", "other",
    }  # fmt: skip
    assert CATALOG["tpot"].record_field == "tpot_s"


def test_buckets_include_every_spec_threshold_sorted() -> None:
    spec = SLOSpec.from_yaml(
        "tiers:\n- name: a\n  objectives: [p95 ttft <= 200ms, p99 ttft <= 333ms, p95 e2e <= 7s]\n"
    )
    buckets = buckets_for("ttft", spec)
    assert 0.2 in buckets and 0.333 in buckets
    assert list(buckets) == sorted(set(buckets))
    assert set(CATALOG["ttft"].default_buckets) <= set(buckets)
    assert 7.0 not in buckets  # an e2e threshold is not a ttft boundary
    assert buckets_for("ttft") == CATALOG["ttft"].default_buckets


def test_unknown_sli_bucket_request_names_the_catalog() -> None:
    with pytest.raises(KeyError, match="unknown SLI 'ttfb'"):
        buckets_for("ttfb")
