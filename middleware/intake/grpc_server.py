"""OTLP over gRPC: the TraceService of opentelemetry-proto, `Export` on HOST:PORT, where vLLM
and SGLang send by default (`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc`) and TGI always does.

    intake = GrpcIntake(join, "127.0.0.1:4317", token="...")   # binds and serves at once
    intake.attach(asyncio.get_running_loop())                  # the loop that runs the join
    intake.close()

A small thread pool of grpcio's server reads each export; the export's bytes are then handed
to the event loop that serves the requests (the span join is single-threaded) and taken there
as `POST /v1/traces` takes a body (`endpoint.take_export`): the same decode, size limit, join
and counters. The handler is registered under the generated service's name with the request
left as bytes, so the lean decode of `otlp` reads it, not the full generated message.

Answers: OK with an empty `ExportTraceServiceResponse`; INVALID_ARGUMENT for an export that is
not an `ExportTraceServiceRequest` or is over the size limit (counted as rejected, as the
HTTP intake's 400 and 413 are); UNAUTHENTICATED without `authorization: Bearer <token>` when a
token is set; UNAVAILABLE (the exporter retries) before the loop is attached or while closing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from middleware.intake.endpoint import take_export
from middleware.intake.join import SpanJoin
from middleware.intake.otlp import MAX_EXPORT_BYTES, IntakeError
from middleware.ops_guard import bearer_matches, token_digest

if TYPE_CHECKING:
    import grpc

    from middleware.config import EngineSpansConfig

PROTOBUF = "application/x-protobuf"
# grpcio refuses a message past this itself (RESOURCE_EXHAUSTED, before any handler sees it);
# up to it, an export over MAX_EXPORT_BYTES reaches the handler and is counted as rejected.
RECEIVE_LIMIT = 2 * MAX_EXPORT_BYTES
TAKE_TIMEOUT_S = 10.0  # the most an export waits for the event loop to take it
_POLL_S = 0.05  # how often a waiting handler looks whether the intake is closing
GRPC_MISSING = (
    "OTLP over gRPC needs grpcio: pip install 'llm-slo[grpc]' (or grpcio), or send OTLP/HTTP "
    "to POST /v1/traces"
)


def _grpc() -> Any:
    try:
        import grpc
    except ImportError as error:
        raise RuntimeError(GRPC_MISSING) from error
    return grpc


class GrpcIntake:
    """The TraceService on `address`, serving from construction until `close`."""

    def __init__(
        self,
        join: SpanJoin,
        address: str,
        *,
        token: str | None = None,
        certfile: str | None = None,
        keyfile: str | None = None,
        ca_certs: str | None = None,
        threads: int = 2,
        shared_port: bool = False,
    ) -> None:
        grpc = _grpc()
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        self.join = join
        self._digest = None if token is None else token_digest(token)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = threading.Event()
        service = trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"].full_name
        handler = grpc.method_handlers_generic_handler(
            service, {"Export": grpc.unary_unary_rpc_method_handler(self.export)}
        )
        self._server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="llm-slo-otlp-grpc"),
            handlers=[handler],
            # One listener per address unless the port is shared by design (a server's workers):
            # a second process on it is an error, not a share.
            options=[
                ("grpc.max_receive_message_length", RECEIVE_LIMIT),
                ("grpc.so_reuseport", int(shared_port)),
            ],
        )
        self.tls = certfile is not None
        self.port = self._bind(grpc, address, certfile, keyfile, ca_certs)
        self.address = f"{address.rpartition(':')[0]}:{self.port}"
        self._server.start()

    def _bind(
        self,
        grpc: Any,
        address: str,
        certfile: str | None,
        keyfile: str | None,
        ca_certs: str | None,
    ) -> int:
        try:
            if certfile is None:
                port = self._server.add_insecure_port(address)
            else:
                port = self._server.add_secure_port(
                    address, _credentials(grpc, certfile, keyfile, ca_certs)
                )
        except RuntimeError as error:  # grpcio >= 1.51 raises where older ones returned 0
            raise OSError(f"OTLP/gRPC intake: cannot listen on {address} ({error})") from None
        if port == 0:
            raise OSError(f"OTLP/gRPC intake: cannot listen on {address} (in use?)")
        return int(port)

    def attach(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Take exports on `loop` (default: the running one), the loop that runs the join."""
        self._loop = loop if loop is not None else asyncio.get_running_loop()

    def close(self, grace_s: float = 1.0) -> None:
        """Stop serving: exports in flight get `grace_s` to finish; idempotent."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._server.stop(grace_s).wait(grace_s + 1.0)

    def export(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        """`TraceService/Export`: one export taken, or an error status."""
        grpc = _grpc()
        if self._digest is not None and not self._authorized(context):
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "the span intake needs the operations token: send metadata "
                "'authorization: Bearer <token>' (OTEL_EXPORTER_OTLP_TRACES_HEADERS)",
            )
        error = self._take_on_loop(request, context)
        if error is not None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"TraceService/Export: {error}")
        return b""  # an empty ExportTraceServiceResponse: every span taken

    def _authorized(self, context: grpc.ServicerContext) -> bool:
        assert self._digest is not None
        for key, value in context.invocation_metadata():
            if key == "authorization" and isinstance(value, str):
                return bearer_matches(self._digest, value)
        return False

    def _take_on_loop(self, request: bytes, context: grpc.ServicerContext) -> str | None:
        """Hand the export to the loop and wait for it: None when taken, else what is wrong."""
        grpc = _grpc()
        loop = self._loop
        unavailable = grpc.StatusCode.UNAVAILABLE
        if loop is None or self._closing.is_set():
            context.abort(unavailable, "the span intake is not serving yet; retry")
            return None  # not reached: abort raises
        done: concurrent.futures.Future[str | None] = concurrent.futures.Future()
        try:
            loop.call_soon_threadsafe(self._take, request, done)
        except RuntimeError:  # the loop is closed
            context.abort(unavailable, "the span intake has stopped")
        deadline = time.monotonic() + TAKE_TIMEOUT_S
        while True:
            try:
                return done.result(timeout=_POLL_S)
            except TimeoutError:
                # Not yet taken: give up only if it never will be (a cancelled callback does
                # nothing), so an export is joined exactly once or answered UNAVAILABLE.
                late = self._closing.is_set() or time.monotonic() > deadline
                if late and done.cancel():
                    context.abort(unavailable, "the span intake is busy or stopping; retry")

    def _take(self, request: bytes, done: concurrent.futures.Future[str | None]) -> None:
        """On the loop: the export read and joined, as `POST /v1/traces` takes a body."""
        if not done.set_running_or_notify_cancel():
            return  # its handler gave up waiting and answered UNAVAILABLE
        try:
            take_export(self.join, request, PROTOBUF)
        except IntakeError as error:
            done.set_result(str(error))
        except BaseException as error:  # the handler answers UNKNOWN; the loop goes on
            done.set_exception(error)
        else:
            done.set_result(None)


def _credentials(grpc: Any, certfile: str, keyfile: str | None, ca_certs: str | None) -> Any:
    """The listener's TLS: the certificate chain and its key (PEM), mutual with `ca_certs`."""
    chain = Path(certfile).read_bytes()
    key = Path(keyfile).read_bytes() if keyfile is not None else chain
    roots = Path(ca_certs).read_bytes() if ca_certs is not None else None
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=roots, require_client_auth=roots is not None
    )


def grpc_intake(join: SpanJoin, spans: EngineSpansConfig) -> GrpcIntake:
    """The intake a middleware's `engine_spans.otlp_grpc*` fields describe (grpcio is
    imported only here, when one is configured)."""
    assert spans.otlp_grpc is not None
    return GrpcIntake(
        join,
        spans.otlp_grpc,
        token=spans.otlp_grpc_token,
        certfile=spans.otlp_grpc_certfile,
        keyfile=spans.otlp_grpc_keyfile,
        ca_certs=spans.otlp_grpc_ca_certs,
        shared_port=spans.otlp_grpc_shared,
    )
