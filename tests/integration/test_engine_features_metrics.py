"""Prefix caching and speculative decoding show up in /metrics and in the records."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytest.importorskip("torch")

from tests.helpers.servers import slo_serve


def total(text: str, name: str) -> float:
    return sum(
        s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name
    )


def test_prefix_hits_and_speculative_tokens_are_exported(tmp_path: Path) -> None:
    system = "You are a careful assistant. Answer briefly and cite the verse. " * 4
    args = (
        "--model",
        "bundled:small",
        "--enable-prefix-caching",
        # The target as its own draft agrees with itself: at temperature 0 greedy verification
        # accepts what it drafted, so acceptance must be well above 0 (a random draft may
        # honestly reach 0, which would hide a verification that accepts nothing).
        "--draft-model",
        "bundled:small",
        "--store",
        f"sqlite:///{tmp_path}/r.db",
    )
    with slo_serve(*args) as base_url:
        for question in ("Who was king?", "Who was the prophet?", "What is the law?"):
            body = {
                "model": "bundled:small",
                "prompt": system + question,
                "max_tokens": 12,
                "temperature": 0,
            }
            assert (
                httpx.post(base_url + "/v1/completions", json=body, timeout=60).status_code == 200
            )
        text = httpx.get(base_url + "/metrics").text
    assert total(text, "llm_slo_prefix_cache_queries_total") > 0
    assert (
        0
        < total(text, "llm_slo_prefix_cache_hits_total")
        <= total(text, "llm_slo_prefix_cache_queries_total")
    )
    assert total(text, "llm_slo_spec_decode_draft_tokens_total") > 0
    drafted = total(text, "llm_slo_spec_decode_draft_tokens_total")
    accepted = total(text, "llm_slo_spec_decode_accepted_tokens_total")
    assert 0.5 * drafted < accepted <= drafted, (accepted, drafted)

    from slo.store import RecordStore

    store = RecordStore(f"sqlite:///{tmp_path}/r.db")
    records = sorted(store.query(), key=lambda r: r.timestamp)
    store.close()
    assert len(records) == 3
    assert records[0].cached_tokens == 0 and records[-1].cached_tokens > 0
