"""`slo proxy --upstream-metrics`: a real `slo proxy` process in front of a real upstream (uvicorn
on 127.0.0.1) whose /metrics is vLLM's families, rendered by prometheus_client as vLLM renders
them, changing while the proxy runs. The proxy's own /metrics and its /slo.html data follow
within a few scrape intervals; `off` reads nothing; an upstream without /metrics is one warning,
no error, and is picked up once it answers."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.engine_metrics_upstream import (
    DEFAULT_TIER,
    MODEL,
    EngineWithMetrics,
    chat_through,
    slo_proxy,
)
from tests.helpers.polling import wait_until
from tests.helpers.servers import uvicorn_thread

pytestmark = pytest.mark.integration

INTERVAL_S = 0.2


def samples(base_url: str, name: str) -> dict[str, float]:
    """The proxy's exported samples of `name` for our model, by tier ("" where it has none)."""
    text = httpx.get(base_url + "/metrics", timeout=5).text
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("model") == MODEL:
                found[sample.labels.get("tier", "")] = sample.value
    return found


def engine_panel(base_url: str) -> Any:
    """What the "Engine now" panel of /slo.html shows (the page's JSON)."""
    return httpx.get(base_url + "/slo?view=page", timeout=5).json()["engine"]


def test_the_proxy_shows_the_engines_gauges_as_they_change(tmp_path: Path) -> None:
    engine = EngineWithMetrics()
    with (
        uvicorn_thread(engine) as upstream_url,
        slo_proxy(upstream_url, tmp_path, "--upstream-metrics-interval", str(INTERVAL_S)) as (
            base_url,
            _,
        ),
    ):
        chat_through(base_url)
        queue = "llm_slo_queue_depth"
        wait_until(lambda: samples(base_url, queue) == {DEFAULT_TIER: 3}, 5, "queue depth 1 + 2")
        assert samples(base_url, "llm_slo_running_requests") == {"": 8}
        assert samples(base_url, "llm_slo_kv_cache_usage_ratio") == {"": 0.5}
        assert samples(base_url, "llm_slo_preemptions_total") == {DEFAULT_TIER: 0}
        engine.set(waiting=(0, 7), running=(2, 3), kv=(0.75, 0.5))
        engine.preemptions.labels(*engine.engines[1]).inc(4)
        preempted = "llm_slo_preemptions_total"
        wait_until(lambda: samples(base_url, preempted) == {DEFAULT_TIER: 4}, 5, "4 preemptions")
        wait_until(lambda: samples(base_url, queue) == {DEFAULT_TIER: 7}, 5, "queue depth 0 + 7")
        # The "Engine now" panel: one scrape that saw the whole change.
        now = {"running": 5, "batch_size": 5, "kv_usage": 0.75, "queue_depth": {DEFAULT_TIER: 7}}
        wait_until(lambda: engine_panel(base_url) == now, 5, f"/slo.html's engine data {now}")
        chat_through(base_url)
        assert engine.chat.completed == 2


def test_off_reads_nothing(tmp_path: Path) -> None:
    engine = EngineWithMetrics()
    with (
        uvicorn_thread(engine) as upstream_url,
        slo_proxy(upstream_url, tmp_path, "--upstream-metrics", "off") as (base_url, _),
    ):
        chat_through(base_url)
        time.sleep(5 * INTERVAL_S)  # what scraping there was would have happened by now
        assert engine.metrics_gets == 0
        assert samples(base_url, "llm_slo_running_requests") == {}
        assert engine_panel(base_url) is None


def test_an_upstream_without_metrics_is_no_error_and_is_read_once_it_answers(
    tmp_path: Path,
) -> None:
    engine = EngineWithMetrics(serving=False)
    with (
        uvicorn_thread(engine) as upstream_url,
        slo_proxy(upstream_url, tmp_path, "--upstream-metrics-interval", str(INTERVAL_S)) as (
            base_url,
            output,
        ),
    ):
        chat_through(base_url)
        wait_until(lambda: engine.metrics_gets >= 5, 10, "five tries at the upstream's /metrics")
        assert samples(base_url, "llm_slo_running_requests") == {}
        chat_through(base_url)
        engine.serving = True  # the engine's metrics come up after the proxy started
        running = "llm_slo_running_requests"
        wait_until(lambda: samples(base_url, running) == {"": 8}, 5, "running 4 + 4")
    warnings = [line for line in output if "no engine metrics from" in line]
    assert len(warnings) == 1, output
    assert f"{upstream_url}/metrics: it answers HTTP 404" in warnings[0]
    assert not [line for line in output if "Traceback" in line or "ERROR" in line], output
