"""Behind `slo proxy`, the SLO-headroom gauge follows the engine's own queue: a real proxy
process in front of an upstream serving vLLM's /metrics (`vllm:num_requests_waiting`), which
the proxy reads into `llm_slo_queue_depth` (the engine's queue is engine-wide: the default
tier's), and its /metrics computes the gauge from it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slo.headroom import GAUGE, WINDOW_S, signals
from slo.spec import SLOSpec
from tests.helpers.engine_metrics_upstream import (
    DEFAULT_TIER,
    EngineWithMetrics,
    chat_through,
    slo_proxy,
)
from tests.helpers.polling import wait_until
from tests.helpers.servers import uvicorn_thread

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def ratios(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url + "/metrics", timeout=5).text
    return {
        sample.labels["tier"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == GAUGE
    }


def test_the_gauge_behind_the_proxy_reads_the_engines_waiting_requests(tmp_path: Path) -> None:
    spec = SLOSpec.default()  # what the proxy judges with when given no --spec
    by_tier = {signal.tier: signal for signal in signals(spec)}
    assert DEFAULT_TIER in by_tier, "the packaged spec's default tier has a TTFT objective"
    threshold = by_tier[DEFAULT_TIER].threshold_s
    engine = EngineWithMetrics()  # 1 + 2 requests waiting in its two engines
    with (
        uvicorn_thread(engine) as upstream_url,
        slo_proxy(upstream_url, tmp_path, "--upstream-metrics-interval", "0.2") as (base_url, _),
    ):
        # 3 waiting, no request finished yet (the drain rate's floor: one request per
        # window), no prefill time known behind a proxy: 3 * WINDOW_S over the objective.
        expected = 3 * WINDOW_S / threshold
        wait_until(
            lambda: ratios(base_url).get(DEFAULT_TIER) == pytest.approx(expected),
            5,
            f"{GAUGE}{{tier={DEFAULT_TIER!r}}} = {expected:g}",
        )
        assert set(ratios(base_url)) == set(by_tier)
        engine.set(waiting=(0, 0), running=(1, 1), kv=(0.1, 0.1))
        wait_until(lambda: ratios(base_url).get(DEFAULT_TIER) == 0.0, 5, "an empty queue")
        chat_through(base_url)  # requests still pass: the gauge is read, never in the way
