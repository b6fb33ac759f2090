"""OTLP over gRPC behind `slo proxy --otlp-grpc`: a vLLM-shaped engine (the stand-in) exporting
its request spans through the OpenTelemetry SDK's default gRPC exporter, as vLLM and SGLang do
unless told otherwise, joins with no Collector: 24 streams, every record with the span's queue,
prefill and decode. A malformed export is INVALID_ARGUMENT and counted as the HTTP intake's
400 is; with an operations token and TLS, the token is `authorization` metadata."""

from __future__ import annotations

import asyncio
import contextlib
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

grpc = pytest.importorskip("grpc", reason="the OTLP/gRPC intake needs grpcio (llm-slo[grpc])")
pytest.importorskip(
    "opentelemetry.exporter.otlp.proto.grpc",
    reason="the engines' default exporter: opentelemetry-exporter-otlp-proto-grpc",
)

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: E402
    OTLPSpanExporter,
)
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from slo.cli.bench.server import free_port, stop_process  # noqa: E402
from slo.sli import CATALOG  # noqa: E402
from tests.helpers.metric_samples import metric_values, samples_of, total  # noqa: E402
from tests.helpers.polling import wait_for, wait_until_ready  # noqa: E402
from tests.helpers.proxy_process import tls_proxy  # noqa: E402
from tests.helpers.proxy_upstream import OpenAIUpstream  # noqa: E402
from tests.helpers.record_rows import records  # noqa: E402
from tests.helpers.servers import uvicorn_thread  # noqa: E402
from tests.helpers.standin_process import standin_server  # noqa: E402
from tests.helpers.tls import Pki  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUEUE_S, PREFILL_S, DECODE_S, TOKENS, STREAMS = 0.04, 0.03, 0.004, 8, 24
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
TOKEN = "ops-2c9e4f1a7b3d5e6081a2b3c4d5e6f708"


@contextlib.contextmanager
def slo_proxy(port: int, upstream_url: str, db: Path, *args: str) -> Iterator[str]:
    command = [sys.executable, "-m", "slo.cli", "proxy", "--upstream", upstream_url]
    command += ["--port", str(port), "--store", f"sqlite:///{db}", "--model", "standin"]
    command += ["--upstream-metrics", "off", *args]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base_url + "/metrics", process=child)
        yield base_url
    finally:
        stop_process(child)
        output = child.stdout.read() if child.stdout is not None else ""
        if child.stdout is not None:
            child.stdout.close()
        assert child.returncode == 0, output
    assert "OTLP/gRPC span intake: 127.0.0.1:" in output, output


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


def test_the_engines_default_grpc_exporter_joins_every_stream(tmp_path: Path) -> None:
    port, grpc_port = free_port(), free_port()
    db = tmp_path / "records.db"
    flags = ("--engine-spans", "always", "--engine-span-wait", "15")
    with (
        standin_server(
            "vllm",
            tmp_path,
            queue_s=QUEUE_S,
            prefill_s=PREFILL_S,
            decode_s=DECODE_S,
            otlp_url=f"http://127.0.0.1:{grpc_port}",
            otlp_encoding="grpc",
            export_delay_max_s=1,
            seed=3,
        ) as upstream,
        slo_proxy(port, upstream, db, *flags, "--otlp-grpc", f"127.0.0.1:{grpc_port}") as base_url,
    ):
        assert asyncio.run(stream_all(base_url, STREAMS)) == [TOKENS] * STREAMS
        joined = CATALOG["engine_spans_joined"].metric
        wait_for(lambda: total(metric_values(base_url), joined) >= STREAMS)
        export = grpc.insecure_channel(f"127.0.0.1:{grpc_port}").unary_unary(EXPORT)
        with pytest.raises(grpc.RpcError) as raised:
            export(b"\xff\x00not an ExportTraceServiceRequest", timeout=10)
        values = metric_values(base_url)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "protobuf" in raised.value.details()
    assert total(values, CATALOG["engine_span_exports_rejected"].metric) == 1
    assert total(values, joined) == STREAMS
    assert total(values, CATALOG["engine_spans_unmatched"].metric) == 0
    rows = records(db)
    assert len(rows) == STREAMS
    for row in rows:
        assert row["queue_prefill_s"] is None, row
        for phase, expected in (
            ("queue_s", QUEUE_S),
            ("prefill_s", PREFILL_S),
            ("decode_s", DECODE_S * (TOKENS - 1)),
        ):
            assert math.isclose(row[phase], expected, abs_tol=1e-3), row  # type: ignore[arg-type]


def _vllm_spans() -> list:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    attributes: dict[str, str | float] = {
        "gen_ai.request.id": "chatcmpl-x",
        "gen_ai.latency.time_in_queue": 0.5,
    }
    provider.get_tracer("vllm").start_span("llm_request", attributes=attributes).end()
    return list(memory.get_finished_spans())


def test_the_token_is_metadata_and_tls_is_the_proxys(pki: Pki, tmp_path: Path) -> None:
    token_file = tmp_path / "ops-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    grpc_port = free_port()
    flags = ("--ops-token-file", str(token_file), "--otlp-grpc", f"127.0.0.1:{grpc_port}")
    roots = grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
    with (
        uvicorn_thread(OpenAIUpstream()) as upstream,
        tls_proxy(pki, upstream, tmp_path / "records.db", *flags) as url,
    ):
        export = grpc.secure_channel(f"127.0.0.1:{grpc_port}", roots).unary_unary(EXPORT)
        codes = []
        for metadata in ((), (("authorization", "Bearer not-the-token"),)):
            with pytest.raises(grpc.RpcError) as raised:
                export(b"", timeout=10, metadata=metadata)
            codes.append(raised.value.code())
        assert export(b"", timeout=10, metadata=(("authorization", f"Bearer {TOKEN}"),)) == b""
        plain = grpc.insecure_channel(f"127.0.0.1:{grpc_port}").unary_unary(EXPORT)
        with pytest.raises(grpc.RpcError) as raised:
            plain(b"", timeout=5)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE  # no TLS, no talk
        # The SDK's exporter, as an engine sends: the token in its headers.
        sdk = OTLPSpanExporter(
            endpoint=f"https://127.0.0.1:{grpc_port}",
            credentials=roots,
            headers={"authorization": f"Bearer {TOKEN}"},
        )
        assert sdk.export(_vllm_spans()) == SpanExportResult.SUCCESS
        sdk.shutdown()
        scrape = httpx.get(
            url + "/metrics",
            verify=pki.client_context(),
            headers={"authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 2
    values = samples_of(scrape.text)
    assert total(values, CATALOG["engine_spans_unmatched"].metric) == 1  # the SDK's span
    assert total(values, CATALOG["engine_span_exports_rejected"].metric) == 0


def test_two_workers_share_the_grpc_port_and_join_every_stream(tmp_path: Path) -> None:
    """`--workers 2`: the engine's one gRPC connection reaches one worker; the span relay hands
    the other worker the spans of its requests, as with OTLP/HTTP."""
    port, grpc_port = free_port(), free_port()
    db = tmp_path / "records.db"
    flags = ("--engine-spans", "always", "--engine-span-wait", "15", "--workers", "2")
    with (
        standin_server(
            "vllm",
            tmp_path,
            queue_s=QUEUE_S,
            prefill_s=PREFILL_S,
            decode_s=DECODE_S,
            otlp_url=f"http://127.0.0.1:{grpc_port}",
            otlp_encoding="grpc",
            export_delay_max_s=1,
            seed=5,
        ) as upstream,
        slo_proxy(port, upstream, db, *flags, "--otlp-grpc", f"127.0.0.1:{grpc_port}") as base_url,
    ):
        assert asyncio.run(stream_all(base_url, STREAMS)) == [TOKENS] * STREAMS
        joined = CATALOG["engine_spans_joined"].metric
        wait_for(lambda: total(metric_values(base_url), joined) >= STREAMS)
        wait_for(lambda: len(records(db)) >= STREAMS)
        values = metric_values(base_url)
    assert total(values, joined) == STREAMS
    assert total(values, CATALOG["engine_spans_unmatched"].metric) == 0
    rows = records(db)
    assert len(rows) == STREAMS and all(row["queue_prefill_s"] is None for row in rows)
    assert all(math.isclose(row["queue_s"], QUEUE_S, abs_tol=1e-3) for row in rows)  # type: ignore[arg-type]
