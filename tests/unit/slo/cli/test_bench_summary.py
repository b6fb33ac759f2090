"""Goodput and the per-tier summary: the client's view wins, every latency objective counts."""

from __future__ import annotations

from typing import Any

import pytest

from slo.check.summary import columns_of, good_requests, summarize
from slo.cli.bench.summary import render_summary
from tests.helpers.tier_specs import make_tier, spec

SPEC = spec(
    make_tier(
        "premium", "p95 ttft <= 200ms", "p95 tpot <= 50ms", "p95 itl <= 1ms", "goodput >= 95%"
    ),
    make_tier("standard", "p95 ttft <= 500ms", default=True),
    window=None,
)


def record(tier: str = "premium", **fields: Any) -> dict[str, Any]:
    return {"request_id": "r", "timestamp": 1.0, "tier": tier, "e2e_s": 1.0, "ttft_s": 0.1,
            "tpot_s": 0.01, **fields}  # fmt: skip


def test_a_request_is_good_only_within_every_per_request_objective_of_its_tier() -> None:
    rows = [
        record(),  # good
        record(ttft_s=0.3),  # TTFT over 200 ms
        record(tpot_s=0.06),  # TPOT over 50 ms
        record(ttft_s=0.3, client_ttft_s=0.15),  # the client saw 150 ms: that counts
        record(ttft_s=0.1, client_ttft_s=0.25),  # ... also when it is worse
        record(tpot_s=None, output_tokens=1),  # no TPOT (one token): passes
        record(outcome="server_error"),  # not ok: never good
        record(client_itl_s=[0.5, 0.5]),  # ITL is per gap, outside goodput (as in vLLM)
        record("standard", ttft_s=0.3),  # standard allows 500 ms
    ]
    assert good_requests(SPEC, columns_of(rows)).tolist() == [
        True, False, False, True, False, True, False, True, True,
    ]  # fmt: skip


def test_summary_per_tier_uses_the_client_view_and_sees_beyond_the_server() -> None:
    rows = [record(client_ttft_s=(120 + i) / 1000, client_e2e_s=1.004, network_s=0.001,
                   queue_s=0.05) for i in range(20)]  # fmt: skip
    rows.append(record("standard", ttft_s=0.9))
    premium, standard = summarize(SPEC, columns_of(rows))
    assert (premium.tier, premium.requests, premium.good) == ("premium", 20, 20)
    assert premium.ttft_p50_s == 0.129 and premium.ttft_p95_s == 0.138  # nearest rank
    assert premium.phase_means_s["queue_s"] == pytest.approx(0.05)
    assert abs(premium.client_network_mean_s - 0.004) < 1e-9  # type: ignore[operator]
    assert (standard.requests, standard.good, standard.client_network_mean_s) == (1, 0, None)
    text = render_summary(SPEC, columns_of(rows), elapsed_s=10.0)
    assert "goodput 2.00 req/s (20/21" in text
