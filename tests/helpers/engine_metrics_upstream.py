"""An OpenAI-style upstream that also serves vLLM's /metrics (two data-parallel engines, gauges
the test sets), `slo proxy` in front of it yielding its output lines too, and one chat request
through the proxy."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from middleware.types import Receive, Scope, Send
from slo.cli.bench.server import free_port, stop_process
from slo.spec import SLOSpec
from tests.helpers.polling import wait_until_ready
from tests.helpers.proxy_upstream import OpenAIUpstream

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


def chat_through(base_url: str) -> None:
    response = httpx.post(base_url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert response.status_code == 200, response.text
