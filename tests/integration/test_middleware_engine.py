"""The middleware around the real engine under uvicorn: spans, metrics, records, client truth."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")

from fastapi import FastAPI
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from engine import Engine
from engine.api import create_app
from middleware import LatencyMiddleware
from middleware.config import MiddlewareConfig
from slo.arithmetic import verdict
from slo.spec import SLOSpec
from slo.store import RecordStore
from tests.helpers.record_samples import phase_parts
from tests.helpers.servers import free_port, uvicorn_thread, wait_until_ready

MODEL = "bundled:tiny"


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, LatencyMiddleware, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    engine = Engine.from_pretrained(MODEL)
    store = RecordStore(f"sqlite:///{tmp_path_factory.mktemp('records') / 'records.db'}")
    app = LatencyMiddleware(
        create_app(engine),
        store=store,
        model=engine.name,
        config=MiddlewareConfig.of(tracer_provider=provider),
    )
    engine.add_hooks(app.engine_hooks())
    with uvicorn_thread(app) as base_url:
        yield base_url, app, exporter
    app.close()


def metric_value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def stream_request(client: httpx.Client, tier: str, max_tokens: int) -> tuple[float, str]:
    """Client-side TTFT (first content chunk) and the request id."""
    body = {
        "model": MODEL,
        "prompt": "Hello there",
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
    }
    started = time.perf_counter()
    ttft = None
    with client.stream(
        "POST", "/v1/completions", json=body, headers={"x-llm-tier": tier}
    ) as response:
        request_id = response.headers["x-request-id"]
        for line in response.iter_lines():
            if ttft is None and line.startswith("data: {") and '"text":""' not in line:
                ttft = time.perf_counter() - started
    assert ttft is not None
    return ttft, request_id


def test_records_metrics_spans_agree_with_the_client(
    served: tuple[str, LatencyMiddleware, InMemorySpanExporter],
) -> None:
    base_url, app, exporter = served
    exporter.clear()
    before = httpx.get(base_url + "/metrics").text
    sent = {"premium": 0, "standard": 0, "batch": 0}
    client_ttft: dict[str, float] = {}
    with httpx.Client(base_url=base_url, timeout=60) as client:
        for index in range(12):
            tier = list(sent)[index % 3]
            ttft, request_id = stream_request(client, tier, max_tokens=4 + index)
            client_ttft[request_id] = ttft
            sent[tier] += 1
        response = client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
        )
        assert response.status_code == 200 and "e2e;dur=" in response.headers["server-timing"]
    after = httpx.get(base_url + "/metrics").text
    for tier, count in sent.items():
        counted = metric_value(
            after, "llm_slo_requests_total", tier=tier, outcome="ok", route="/v1/completions"
        ) - metric_value(
            before, "llm_slo_requests_total", tier=tier, outcome="ok", route="/v1/completions"
        )
        assert counted == count

    assert app.store is not None
    app.store.flush()
    records = {r.request_id: r for r in app.store.query()}
    for request_id, ttft in client_ttft.items():
        record = records[request_id]
        assert record.ttft_s is not None and record.ttft_s <= ttft
        assert record.queue_s is not None and record.prefill_s is not None and record.prefill_s > 0
        parts = phase_parts(record)
        assert sum(parts) == pytest.approx(record.e2e_s, abs=1e-6)

    spans = exporter.get_finished_spans()
    servers = [s for s in spans if s.kind.name == "SERVER"]
    assert len(servers) == 13
    for server in servers:
        children = [
            s for s in spans if s.parent is not None and s.parent.span_id == server.context.span_id
        ]
        names = {c.name for c in children}
        assert {"receive", "queue", "prefill", "decode", "send"} <= names
        for child in children:
            assert server.start_time <= child.start_time <= child.end_time <= server.end_time
        assert server.attributes["llm_slo.ttft_s"] > 0
        assert server.attributes["gen_ai.request.model"] == MODEL
        # Detokenize is measured: one event per detokenization at its real time, inside the
        # span from the first to the last, and their durations add up to the busy time.
        (detokenize,) = [c for c in children if c.name == "detokenize"]
        (decode,) = [c for c in children if c.name == "decode"]
        events = detokenize.events
        assert events and len(events) == detokenize.attributes["llm_slo.detokenize.calls"]
        assert detokenize.start_time == events[0].timestamp >= decode.start_time
        starts = [event.timestamp for event in events]
        assert starts == sorted(starts) and starts[-1] <= detokenize.end_time
        durations = [event.attributes["llm_slo.detokenize.duration_s"] for event in events]
        busy = detokenize.attributes["llm_slo.detokenize.busy_s"]
        assert sum(durations) == pytest.approx(busy, rel=1e-6) and busy > 0
        # The phase is the part of that time within decode (the last token's comes after it).
        assert records[server.attributes["llm_slo.request_id"]].detokenize_s <= busy + 1e-9
        assert (detokenize.end_time - detokenize.start_time) / 1e9 >= max(durations)
        # Who made it wait: one event per culprit tier and cause, as the record holds them.
        blame = records[server.attributes["llm_slo.request_id"]].delay_blame
        assert blame is not None
        blamed = [
            (
                e.attributes["llm_slo.delay.cause"],
                e.attributes["llm_slo.delay.culprit_tier"],
                e.attributes["llm_slo.delay.seconds"],
                e.attributes["llm_slo.delay.requests"],
            )
            for e in server.events
            if e.name == "llm_slo.delay_caused"
        ]
        assert blamed and blamed == [
            (b["cause"], b["tier"], b["s"], b["requests"]) for b in blame["by_tier"]
        ]
        assert all(e.timestamp == server.end_time for e in server.events)
    assert app.span_drops.dropped == 0


def test_traceparent_is_honored(
    served: tuple[str, LatencyMiddleware, InMemorySpanExporter],
) -> None:
    base_url, _, exporter = served
    exporter.clear()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    headers = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    response = httpx.post(
        base_url + "/v1/completions",
        json={"model": MODEL, "prompt": "x", "max_tokens": 2},
        headers=headers,
    )
    assert response.status_code == 200
    # Spans are emitted once the last byte is sent: the client can read the answer first.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        servers = [s for s in exporter.get_finished_spans() if s.kind.name == "SERVER"]
        if servers:
            break
        time.sleep(0.01)
    (server,) = servers
    assert format(server.context.trace_id, "032x") == trace_id


def test_openmetrics_exemplars_carry_trace_ids(
    served: tuple[str, LatencyMiddleware, InMemorySpanExporter],
) -> None:
    base_url, _, _ = served
    httpx.post(base_url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2})
    text = httpx.get(base_url + "/metrics", headers={"accept": "application/openmetrics-text"}).text
    assert '# {trace_id="' in text
    assert text.rstrip().endswith("# EOF")


def test_live_slo_status(served: tuple[str, LatencyMiddleware, InMemorySpanExporter]) -> None:
    """/slo counts this test's own premium requests (whatever other tests sent before)."""
    base_url, _, _ = served

    def premium_status() -> tuple[dict[str, Any], dict[str, Any]]:
        status = httpx.get(base_url + "/slo").json()
        assert {t["tier"] for t in status["tiers"]} == {"premium", "standard", "batch"}
        premium = next(t for t in status["tiers"] if t["tier"] == "premium")
        ttft = next(o for o in premium["objectives"] if o["objective"].startswith("p95 ttft"))
        return premium, ttft

    premium_before, ttft_before = premium_status()
    with httpx.Client(base_url=base_url, timeout=60) as client:
        for _ in range(3):
            stream_request(client, "premium", max_tokens=4)
    # The live windows take a request once its last byte is sent, just after the client has it.
    deadline = time.monotonic() + 5
    while (premium := premium_status()[0])["requests"] < premium_before["requests"] + 3:
        assert time.monotonic() < deadline, (premium_before, premium)
        time.sleep(0.01)
    _, ttft = premium_status()
    assert premium["requests"] == premium_before["requests"] + 3
    assert ttft["events"] == ttft_before["events"] + 3
    # The verdict is the one rule's on the counts /slo shows (the default spec: no spec given).
    spec = SLOSpec.default()
    objective = next(o for o in spec.tier("premium").objectives if o.sli == "ttft")
    assert objective.name == ttft["objective"]
    want = verdict(int(ttft["good"]), int(ttft["events"]), objective.target, spec.min_events)
    assert ttft["verdict"] == want, ttft
    page = httpx.get(base_url + "/slo.html")
    assert page.status_code == 200 and "<table>" in page.text


def test_works_in_starlette_and_fastapi_apps(tmp_path: Path) -> None:
    async def chunks() -> Any:
        for index in range(5):
            yield f"data: {index}\n\n".encode()

    async def stream(request: Request) -> StreamingResponse:
        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    options = {"store": f"sqlite:///{tmp_path / 'a.db'}", "model": "m"}
    starlette_app = Starlette(
        routes=[Route("/v1/completions", stream, methods=["POST"]), Route("/health", health)],
        middleware=[Middleware(LatencyMiddleware, **options)],
    )
    fastapi_app = FastAPI()
    fastapi_app.add_middleware(LatencyMiddleware, store=f"sqlite:///{tmp_path / 'b.db'}", model="m")
    fastapi_app.add_api_route("/v1/completions", stream, methods=["POST"])
    fastapi_app.add_api_route("/health", health)
    for app in (starlette_app, fastapi_app):
        with uvicorn_thread(app) as base_url:
            for _ in range(3):
                response = httpx.post(base_url + "/v1/completions")
                assert response.text.count("data:") == 5
            text = httpx.get(base_url + "/metrics").text
            assert metric_value(text, "llm_slo_requests_total", outcome="ok") == 3
            assert metric_value(text, "llm_slo_inter_token_latency_seconds_count") == 3 * 4


TWO_WORKERS_APP = """
import os
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from middleware import LatencyMiddleware

async def complete(request):
    return JSONResponse({{"choices": [{{"text": "hi"}}]}}, headers={{"x-worker": str(os.getpid())}})

async def health(request):
    return JSONResponse({{"ok": True}})

routes = [Route("/v1/completions", complete, methods=["POST"]), Route("/health", health)]
app = LatencyMiddleware(Starlette(routes=routes), store="sqlite:///{store}", model="m")
"""


def counted_in_file(counter_file: Path, scratch: Path) -> float:
    """`llm_slo_requests_total{outcome="ok"}` in one process's counter file, read alone by
    prometheus_client's own multiprocess collector (a copy in a folder of its own)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    scratch.mkdir()
    (scratch / counter_file.name).write_bytes(counter_file.read_bytes())
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(scratch))
    return sum(
        sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == "llm_slo_requests_total" and sample.labels.get("outcome") == "ok"
    )


def test_two_uvicorn_workers_add_up(tmp_path: Path) -> None:
    (tmp_path / "two_workers_app.py").write_text(TWO_WORKERS_APP.format(store=tmp_path / "r.db"))
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    port = free_port()
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.getcwd()}",
    }
    command = [sys.executable, "-m", "uvicorn", "two_workers_app:app", "--workers", "2"]
    command += ["--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(command, env=env, cwd=tmp_path)
    try:
        base_url = f"http://127.0.0.1:{port}"
        wait_until_ready(base_url + "/health", process=process)
        served: Counter[str] = Counter()
        # A fresh connection per request, so both workers take some.
        for _ in range(40):
            response = httpx.post(base_url + "/v1/completions", headers={"connection": "close"})
            assert response.status_code == 200
            served[response.headers["x-worker"]] += 1
        assert len(served) == 2, f"one worker took every request: {served}"
        text = httpx.get(base_url + "/metrics").text
        # Each worker counted exactly the requests it served, in its own file (every worker's
        # file exists from its start, its label children born at zero: the files alone prove
        # nothing), and /metrics, from whichever worker answers, gives their sum.
        files = sorted(path.name for path in metrics_dir.iterdir())
        for pid, count in served.items():
            counter_file = metrics_dir / f"counter_{pid}.db"
            assert counter_file.is_file(), files
            counted = counted_in_file(counter_file, tmp_path / f"read-{pid}")
            assert counted == count, (pid, counted, served, files)
        assert metric_value(text, "llm_slo_requests_total", outcome="ok") == 40
    finally:
        process.terminate()
        process.wait(timeout=30)
