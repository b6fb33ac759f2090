"""The OTLP/gRPC intake's servicer (middleware.intake.grpc_server): a real grpcio server on a
free loopback port, a real span join on an event loop of its own, exports sent as bytes over
a real channel. An export is joined as `POST /v1/traces` joins it; malformed or oversized ones
are INVALID_ARGUMENT and counted; the token is metadata."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

grpc = pytest.importorskip("grpc", reason="the OTLP/gRPC intake needs grpcio (llm-slo[grpc])")

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from middleware.config import ConfigError, EngineSpansConfig  # noqa: E402
from middleware.intake import SpanJoin  # noqa: E402
from middleware.intake.grpc_server import GrpcIntake  # noqa: E402
from middleware.intake.otlp import MAX_EXPORT_BYTES  # noqa: E402
from middleware.types import Receive, Scope, Send  # noqa: E402
from middleware.upstream import SpanPhases  # noqa: E402

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
T = TypeVar("T")


class LoopThread:
    """An event loop on a thread of its own: the loop a server would serve requests on."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def call(self, function: Callable[[], T]) -> T:
        async def run() -> T:
            return function()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(5)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


def vllm_export(attributes: dict[str, Any]) -> tuple[bytes, str]:
    """An export of one vLLM request span, as the SDK encodes it, and its trace id."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.get_tracer("vllm").start_span("llm_request", attributes=attributes).end()
    (span,) = memory.get_finished_spans()
    return encode_spans([span]).SerializeToString(), format(span.context.trace_id, "032x")


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.stop()


def serve(loop: LoopThread, token: str | None = None) -> tuple[SpanJoin, GrpcIntake, Any]:
    join = SpanJoin(5.0, expect="always")
    intake = GrpcIntake(join, "127.0.0.1:0", token=token)
    intake.attach(loop.loop)
    channel = grpc.insecure_channel(f"127.0.0.1:{intake.port}")
    return join, intake, channel.unary_unary(EXPORT)


def test_an_export_joins_its_request_with_the_spans_phases(loop: LoopThread) -> None:
    join, intake, export = serve(loop)
    attributes = {
        "gen_ai.request.id": "chatcmpl-r1",
        "gen_ai.latency.time_in_queue": 0.125,
        "gen_ai.latency.time_in_model_prefill": 0.0625,
        "gen_ai.latency.time_in_model_decode": 0.5,
    }
    body, trace_id = vllm_export(attributes)
    got: list[SpanPhases | None] = []
    loop.call(lambda: join.begin(trace_id, "r1"))
    loop.call(lambda: join.end(trace_id, "r1"))
    assert loop.call(lambda: join.settle(trace_id, "r1", got.append)) == 5.0  # it waits
    try:
        assert export(body, timeout=5) == b""  # an empty ExportTraceServiceResponse
    finally:
        intake.close()
    assert loop.call(lambda: join.counts.joined) == 1
    (span,) = got
    assert span is not None and (span.queue_s, span.prefill_s, span.decode_s) == (
        0.125,
        0.0625,
        0.5,
    )


@pytest.mark.parametrize("body", [b"\xff\x00not protobuf", b"\x0a" * (MAX_EXPORT_BYTES + 1)])
def test_a_malformed_or_oversized_export_is_invalid_argument_and_counted(
    loop: LoopThread, body: bytes
) -> None:
    join, intake, export = serve(loop)
    try:
        with pytest.raises(grpc.RpcError) as raised:
            export(body, timeout=10)
    finally:
        intake.close()
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "TraceService/Export" in raised.value.details()
    assert loop.call(lambda: (join.counts.rejected, join.counts.spans)) == (1, 0)


def test_the_token_is_read_from_the_authorization_metadata(loop: LoopThread) -> None:
    join, intake, export = serve(loop, token="s3cret")
    body, _ = vllm_export({"gen_ai.latency.time_in_queue": 0.1})
    codes = []
    try:
        for metadata in ((), (("authorization", "Bearer wrong"),), (("authorization", "s3cret"),)):
            with pytest.raises(grpc.RpcError) as raised:
                export(body, timeout=5, metadata=metadata)
            codes.append(raised.value.code())
        assert export(body, timeout=5, metadata=(("authorization", "Bearer s3cret"),)) == b""
    finally:
        intake.close()
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 3
    assert loop.call(lambda: join.counts.spans) == 1  # only the export with the token


def test_before_a_loop_is_attached_exports_are_unavailable_and_retried() -> None:
    join = SpanJoin(5.0)
    intake = GrpcIntake(join, "127.0.0.1:0")
    export = grpc.insecure_channel(f"127.0.0.1:{intake.port}").unary_unary(EXPORT)
    body, _ = vllm_export({"gen_ai.latency.time_in_queue": 0.1})
    try:
        with pytest.raises(grpc.RpcError) as raised:
            export(body, timeout=5)
    finally:
        intake.close()
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert join.counts.spans == 0 and join.counts.rejected == 0


def test_a_taken_port_is_an_error_naming_it(loop: LoopThread) -> None:
    _, first, _ = serve(loop)
    try:
        with pytest.raises(OSError, match=re.escape(f"127.0.0.1:{first.port}")):
            GrpcIntake(SpanJoin(), f"127.0.0.1:{first.port}")
    finally:
        first.close()


@pytest.mark.parametrize("address", ["4317", ":4317", "host:port", "host:70000"])
def test_the_config_wants_host_and_port(address: str) -> None:
    with pytest.raises(ConfigError, match=re.escape("engine_spans.otlp_grpc")):
        EngineSpansConfig(otlp_grpc=address)


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    """An app that speaks lifespan and nothing else."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def test_the_mounted_middleware_serves_it_from_lifespan_start_to_close() -> None:
    from middleware import LatencyMiddleware, MiddlewareConfig

    config = MiddlewareConfig.of(otlp_grpc="127.0.0.1:0", expect="always")
    middleware = LatencyMiddleware(_app, store=None, config=config)
    assert middleware.otlp_grpc is not None and middleware.span_join.intake
    channel = grpc.insecure_channel(f"127.0.0.1:{middleware.otlp_grpc.port}")
    export = channel.unary_unary(EXPORT)
    body, _ = vllm_export({"gen_ai.latency.time_in_queue": 0.1})

    async def serve() -> list[Any]:
        inbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        outbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        running = asyncio.create_task(
            middleware({"type": "lifespan"}, inbox.get, outbox.put)  # type: ignore[arg-type]
        )
        await inbox.put({"type": "lifespan.startup"})
        assert (await outbox.get())["type"] == "lifespan.startup.complete"
        answers = [await asyncio.to_thread(export, body, timeout=5)]
        await inbox.put({"type": "lifespan.shutdown"})
        assert (await outbox.get())["type"] == "lifespan.shutdown.complete"
        await running
        try:
            await asyncio.to_thread(export, body, timeout=2)
        except grpc.RpcError as error:
            answers.append(error.code())
        return answers

    assert asyncio.run(serve()) == [b"", grpc.StatusCode.UNAVAILABLE]
    assert middleware.span_join.counts.spans == 1
    channel.close()
