"""Engine spans behind `slo proxy`: a vLLM-shaped engine (the stand-in, exporting its request
spans through the real OTLP/HTTP exporter to the proxy's `POST /v1/traces`) under 100
concurrent streams, each span exported 0-5 s after its response. Every record carries the
span's queue, prefill and decode, its phases sum to e2e, and the proxy's phase histograms
count what the records say. Then the faults: spans that never come, come twice or come
early, spans of unknown traces and malformed exports: one record per request, always."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from slo.cli.bench.server import free_port, stop_process
from slo.sli import CATALOG, PHASES
from tests.helpers.metric_samples import metric_values, total
from tests.helpers.polling import wait_for, wait_until_ready
from tests.helpers.record_rows import records
from tests.helpers.standin_process import standin_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUEUE_S, PREFILL_S, DECODE_S, TOKENS = 0.04, 0.03, 0.004, 8


@contextlib.contextmanager
def slo_proxy(port: int, upstream_url: str, db: Path, *args: str) -> Iterator[str]:
    command = [sys.executable, "-m", "slo.cli", "proxy", "--upstream", upstream_url,
               "--port", str(port), "--store", f"sqlite:///{db}", "--model", "standin",
               "--upstream-metrics", "off", *args]  # fmt: skip
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base_url + "/metrics", process=child)
        yield base_url
    finally:
        stop_process(child)
        output = ""
        if child.stdout is not None:
            output = child.stdout.read()
            child.stdout.close()
        assert child.returncode == 0, output


async def stream_all(base_url: str, count: int) -> list[int]:
    """`count` concurrent chat streams; the number of content events each got."""
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(index: int) -> int:
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": f"hi {index}"}],
                "max_tokens": TOKENS,
                "stream": True,
            }
            async with client.stream("POST", base_url + "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                text = (await r.aread()).decode()
            return text.count('"content":"') - text.count('"content":""')

        return await asyncio.gather(*(one(index) for index in range(count)))


def test_100_streams_take_their_engine_spans_phases(tmp_path: Path) -> None:
    port = free_port()
    db = tmp_path / "records.db"
    with (
        standin_server(
            "vllm",
            tmp_path,
            queue_s=QUEUE_S,
            prefill_s=PREFILL_S,
            decode_s=DECODE_S,
            otlp_url=f"http://127.0.0.1:{port}/v1/traces",
            export_delay_max_s=5,
            seed=7,
        ) as upstream,
        slo_proxy(
            port, upstream, db, "--engine-spans", "always", "--engine-span-wait", "15"
        ) as base_url,
    ):
        events = asyncio.run(stream_all(base_url, 100))
        assert events == [TOKENS] * 100
        name = CATALOG["engine_spans_joined"].metric
        wait_for(lambda: total(metric_values(base_url), name) >= 100)
        values = metric_values(base_url)
    rows = records(db)
    assert len(rows) == 100
    decode_s = DECODE_S * (TOKENS - 1)
    for row in rows:
        assert row["outcome"] == "ok" and row["queue_prefill_s"] is None
        assert math.isclose(row["queue_s"], QUEUE_S, abs_tol=1e-3), row  # type: ignore[arg-type]
        assert math.isclose(row["prefill_s"], PREFILL_S, abs_tol=1e-3), row  # type: ignore[arg-type]
        assert math.isclose(row["decode_s"], decode_s, abs_tol=1e-3), row  # type: ignore[arg-type]
        parts = sum(row[f"{phase}_s"] or 0.0 for phase in PHASES)  # type: ignore[misc]
        assert math.isclose(parts, row["e2e_s"], abs_tol=1e-6), row  # type: ignore[arg-type]
        assert len(json.loads(str(row["itl_s"]))) == TOKENS - 1
    for phase in ("queue", "prefill", "decode"):
        metric = CATALOG[phase].metric
        assert total(values, metric + "_count") == 100
        recorded = sum(row[f"{phase}_s"] for row in rows)  # type: ignore[misc]
        assert math.isclose(total(values, metric + "_sum"), recorded, rel_tol=1e-6)
    assert total(values, CATALOG["engine_span_waits_expired"].metric) == 0
    assert total(values, CATALOG["engine_spans_unmatched"].metric) == 0


@pytest.mark.parametrize("export", ["never", "twice", "early"])
def test_each_request_is_recorded_once_whatever_happens_to_its_span(
    tmp_path: Path, export: str
) -> None:
    port = free_port()
    db = tmp_path / "records.db"
    with (
        standin_server(
            "vllm",
            tmp_path,
            queue_s=QUEUE_S,
            prefill_s=PREFILL_S,
            decode_s=DECODE_S,
            otlp_url=f"http://127.0.0.1:{port}/v1/traces",
            export=export,
            end_delay_s=0.3,
        ) as upstream,
        slo_proxy(
            port, upstream, db, "--engine-spans", "always", "--engine-span-wait", "2"
        ) as base_url,
    ):
        assert asyncio.run(stream_all(base_url, 10)) == [TOKENS] * 10
        # A span of a trace nobody asked about, and an export that is not one.
        span = {
            "traceId": "ab" * 16,
            "spanId": "cd" * 8,
            "name": "llm_request",
            "attributes": [{"key": "gen_ai.latency.time_in_queue", "value": {"doubleValue": 1.0}}],
        }
        stray = {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}
        assert httpx.post(base_url + "/v1/traces", json=stray).status_code == 200
        bad = httpx.post(
            base_url + "/v1/traces",
            content=b"\x00\xffnot protobuf",
            headers={"content-type": "application/x-protobuf"},
        )
        assert bad.status_code == 400 and "protobuf" in bad.json()["message"]
        time.sleep(2.5)  # past the wait: every report has gone out
        values = metric_values(base_url)
    rows = records(db)
    assert len(rows) == 10 and len({row["request_id"] for row in rows}) == 10
    joined = total(values, CATALOG["engine_spans_joined"].metric)
    expired = total(values, CATALOG["engine_span_waits_expired"].metric)
    assert joined + expired == 10, [
        (r["outcome"], r["queue_prefill_s"], r["output_tokens"]) for r in rows
    ]
    assert total(values, CATALOG["engine_span_exports_rejected"].metric) == 1
    with_phases = [row for row in rows if row["queue_prefill_s"] is None]
    if export == "never":
        assert joined == 0 and not with_phases
    else:
        assert joined == 10 and len(with_phases) == 10
        assert all(math.isclose(r["queue_s"], QUEUE_S, abs_tol=1e-3) for r in rows)  # type: ignore[arg-type]
    if export == "twice":
        assert total(values, CATALOG["engine_spans_duplicate"].metric) == 10
    assert total(values, CATALOG["requests"].metric) == 10  # counted once each
