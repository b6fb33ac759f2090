"""`slo proxy --upstream-metrics`: a real `slo proxy` process in front of a real upstream (uvicorn
on 127.0.0.1) whose /metrics is vLLM's families, rendered by prometheus_client as vLLM renders
them, changing while the proxy runs. The proxy's own /metrics and its /slo.html data follow
within a few scrape intervals; `off` reads nothing; an upstream without /metrics is one warning,
no error, and is picked up once it answers."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from middleware.types import Receive, Scope, Send
from slo.cli.bench.server import free_port, stop_process
from slo.spec import SLOSpec
from tests.helpers.polling import wait_until, wait_until_ready
from tests.helpers.proxy_upstream import OpenAIUpstream
from tests.helpers.servers import uvicorn_thread

pytestmark = pytest.mark.integration

INTERVAL_S = 0.2
MODEL = "test-upstream"
DEFAULT_TIER = SLOSpec.default().default_tier.name
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


class EngineWithMetrics:
    """OpenAIUpstream plus vLLM's /metrics (two data-parallel engines); 404 until `serving`."""

    def __init__(self, serving: bool = True) -> None:
        self.chat = OpenAIUpstream()
        self.serving = serving
        self.metrics_gets = 0
        self.registry = registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.waiting = Gauge("vllm:num_requests_waiting", "Waiting.", labels, registry=registry)
        self.running = Gauge("vllm:num_requests_running", "Running.", labels, registry=registry)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV usage.", labels, registry=registry)
        self.preemptions = Counter("vllm:num_preemptions", "Preempted.", labels, registry=registry)
        self.engines = [("Qwen/Qwen2.5-0.5B-Instruct", str(index)) for index in (0, 1)]
        self.set(waiting=(1, 2), running=(4, 4), kv=(0.25, 0.5))
        for engine in self.engines:
            self.preemptions.labels(*engine).inc(10)  # before the proxy: not counted

    def set(
        self, waiting: tuple[int, ...], running: tuple[int, ...], kv: tuple[float, ...]
    ) -> None:
        for engine, w, r, k in zip(self.engines, waiting, running, kv, strict=True):
            self.waiting.labels(*engine).set(w)
            self.running.labels(*engine).set(r)
            self.kv.labels(*engine).set(k)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/metrics":
            await self.chat(scope, receive, send)
            return
        self.metrics_gets += 1
        status, body = (200, generate_latest(self.registry)) if self.serving else (404, b"")
        headers = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@contextlib.contextmanager
def slo_proxy(upstream_url: str, tmp_path: Path, *args: str) -> Iterator[tuple[str, list[str]]]:
    """`slo proxy` as a subprocess; yields its URL and, once it stopped, its output lines."""
    port = free_port()
    command = [sys.executable, "-m", "slo.cli", "proxy", "--upstream", upstream_url]
    command += ["--port", str(port), "--store", f"sqlite:///{tmp_path / 'records.db'}"]
    command += ["--model", MODEL, *args]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base_url = f"http://127.0.0.1:{port}"
    output: list[str] = []
    try:
        wait_until_ready(base_url + "/metrics", process=child)
        yield base_url, output
    finally:
        stop_process(child)
        if child.stdout is not None:
            output.extend(child.stdout.read().splitlines())
            child.stdout.close()
    assert child.returncode == 0, "\n".join(output)


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


def chat_through(base_url: str) -> None:
    response = httpx.post(base_url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert response.status_code == 200, response.text


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
