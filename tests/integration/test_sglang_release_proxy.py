"""SGLang's released tracing code (the pinned wheel) behind an engine with real queueing (2
slots, 4 clients), exporting through SGLang's own exporter to `slo proxy`: OTLP/HTTP to its
`POST /v1/traces`, or SGLang's default, gRPC, to `--otlp-grpc`. 24 streamed chats, every
record joined, each record's queue, prefill and decode within 1 ms of the engine's own stage
spans (as a second exporter in the engine wrote them)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from slo.cli.bench.server import free_port, stop_process
from slo.sli import CATALOG
from tests.helpers.metric_samples import metric_values, total
from tests.helpers.polling import wait_for, wait_until_ready
from tests.helpers.proxy_process import slo_proxy
from tests.helpers.record_rows import records
from tests.helpers.sglang_release import SglangMissing, wheel_root

pytestmark = [pytest.mark.integration]

CLIENTS, CHATS_EACH, TOKENS = 4, 6, 5


@pytest.fixture(scope="module", autouse=True)
def _sglang_wheel() -> None:
    try:
        wheel_root()
    except SglangMissing as error:
        pytest.skip(str(error))


@contextlib.contextmanager
def sglang_engine(port: int, otlp_url: str, spans_file: Path, protocol: str) -> Iterator[str]:
    env = {**os.environ, "LLM_SLO_SGLANG_OTLP_URL": otlp_url}
    env.pop("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", None)
    if protocol != "grpc":  # gRPC is SGLang's default: nothing to set
        env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = protocol
    env.update(LLM_SLO_SGLANG_SPANS_FILE=str(spans_file), LLM_SLO_SGLANG_SLOTS="2")
    env.update(LLM_SLO_SGLANG_PREFILL_S="0.02", LLM_SLO_SGLANG_DECODE_S="0.008")
    env["SGLANG_OTLP_EXPORTER_SCHEDULE_DELAY_MILLIS"] = "200"
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "tests.helpers.sglang_engine:create_app",
    ]
    command += ["--port", str(port), "--log-level", "warning"]
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url + "/health", process=child)
        yield url
    finally:
        stop_process(child)
        output = child.stdout.read().decode() if child.stdout is not None else ""
        if child.stdout is not None:
            child.stdout.close()
        # uvicorn raises the signal again once it has shut down cleanly
        assert child.returncode in (0, -signal.SIGTERM), output


async def chats(base_url: str) -> list[int]:
    """4 clients, 6 streamed chats each, one after another; content events per chat."""
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(index: int) -> int:
            body = {"model": "m", "messages": [{"role": "user", "content": f"hello {index}"}]}
            body.update(max_tokens=TOKENS, stream=True)
            async with client.stream("POST", base_url + "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                text = (await r.aread()).decode()
            return text.count('"content": "t')

        async def client_loop(first: int) -> list[int]:
            return [await one(first + n) for n in range(CHATS_EACH)]

        runs = await asyncio.gather(*(client_loop(c * CHATS_EACH) for c in range(CLIENTS)))
        return [count for run in runs for count in run]


def stage_phases(spans_file: Path) -> dict[str, tuple[float, float, float]]:
    """Queue, prefill and decode per trace id from the engine's own stage spans."""
    seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for line in spans_file.read_text().splitlines():
        span = json.loads(line)
        seconds[span["trace_id"]][span["name"]] += (span["end_ns"] - span["start_ns"]) / 1e9
    return {
        trace: (s["prefill_waiting"], s["prefill_forward"], s["decode_loop"])
        for trace, s in seconds.items()
        if "prefill_forward" in s
    }


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_24_streams_through_the_proxy_take_sglangs_stage_spans(
    tmp_path: Path, protocol: str
) -> None:
    engine_port, db, spans_file = free_port(), tmp_path / "records.db", tmp_path / "spans.jsonl"
    proxy_args = ["--upstream-metrics", "off", "--engine-spans", "always"]
    proxy_args += ["--engine-span-wait", "15"]
    grpc_address = f"127.0.0.1:{free_port()}"
    if protocol == "grpc":
        proxy_args += ["--otlp-grpc", grpc_address]
    engine_url = f"http://127.0.0.1:{engine_port}"
    with (
        slo_proxy(engine_url, db, *proxy_args) as base_url,
        sglang_engine(
            engine_port,
            grpc_address if protocol == "grpc" else base_url + "/v1/traces",
            spans_file,
            protocol,
        ),
    ):
        events = asyncio.run(chats(base_url))
        assert events == [TOKENS] * (CLIENTS * CHATS_EACH)
        joined = CATALOG["engine_spans_joined"].metric
        wait_for(lambda: total(metric_values(base_url), joined) >= CLIENTS * CHATS_EACH)
        values = metric_values(base_url)
    assert total(values, CATALOG["engine_span_waits_expired"].metric) == 0
    assert total(values, CATALOG["engine_spans_unmatched"].metric) == 0
    rows, engine = records(db), stage_phases(spans_file)
    assert len(rows) == CLIENTS * CHATS_EACH == len(engine)
    queued = 0
    for row in rows:
        queue_s, prefill_s, decode_s = engine[str(row["trace_id"])]
        assert row["queue_prefill_s"] is None, row
        assert row["queue_s"] == pytest.approx(queue_s, abs=1e-3), row
        assert row["prefill_s"] == pytest.approx(prefill_s, abs=1e-3), row
        assert row["decode_s"] == pytest.approx(decode_s, abs=1e-3), row
        queued += queue_s > 0.02  # waited for a slot: longer than one prefill
    assert queued > 0  # 4 clients on 2 slots: some requests queued
