"""Run an engine stand-in (tests/helpers/engine_standins.py) under a real uvicorn process, and
receive OTLP/HTTP in the test: a small receiver that decodes `ExportTraceServiceRequest`
bodies (protobuf or JSON, gzip, deflate or plain) into `ReceivedSpan`s, and metric exports
(POST /v1/metrics) into `ReceivedPoint`s (tests/helpers/otlp_metrics.py).
"""

from __future__ import annotations

import contextlib
import gzip
import http.server
import json
import os
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from slo.cli.bench.server import free_port, stop_process
from tests.helpers.otlp_metrics import ReceivedPoint, decode_metrics
from tests.helpers.polling import wait_until_ready

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    kind: int  # OTLP's enum: 1 internal, 2 server
    trace_id: str  # hex
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    arrived_s: float  # time.monotonic() when the receiver had it
    content_type: str
    content_encoding: str


@dataclass
class OtlpReceiver:
    url: str  # .../v1/traces
    spans: list[ReceivedSpan] = field(default_factory=list)
    points: list[ReceivedPoint] = field(default_factory=list)  # from .../v1/metrics

    @property
    def endpoint(self) -> str:
        """The base URL, for OTEL_EXPORTER_OTLP_ENDPOINT (exporters add /v1/traces, ...)."""
        return self.url.removesuffix("/v1/traces")

    def named(self, predicate: Any) -> list[ReceivedSpan]:
        return [span for span in list(self.spans) if predicate(span.name)]


def _any_value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    return None if which is None else getattr(value, which)


def _json_value(value: Mapping[str, Any]) -> Any:
    for key, raw in value.items():
        return int(raw) if key == "intValue" else raw  # OTLP/JSON writes int64 as a string
    return None


def decode_export(body: bytes, content_type: str) -> list[dict[str, Any]]:
    """Each span of one export body, as a plain dict (ids in hex)."""
    if content_type.startswith("application/json"):
        return _decode_json(json.loads(body))
    message = ExportTraceServiceRequest()
    message.ParseFromString(body)
    spans = []
    for resource_spans in message.resource_spans:
        resource = {a.key: _any_value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    {
                        "name": span.name,
                        "kind": span.kind,
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "start_ns": span.start_time_unix_nano,
                        "end_ns": span.end_time_unix_nano,
                        "attributes": {a.key: _any_value(a.value) for a in span.attributes},
                        "resource": resource,
                    }
                )
    return spans


def _decode_json(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    spans = []
    for resource_spans in document.get("resourceSpans", []):
        attributes = resource_spans.get("resource", {}).get("attributes", [])
        resource = {a["key"]: _json_value(a["value"]) for a in attributes}
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                spans.append(
                    {
                        "name": span["name"],
                        "kind": span.get("kind", 0),
                        "trace_id": span["traceId"],
                        "span_id": span["spanId"],
                        "parent_span_id": span.get("parentSpanId", ""),
                        "start_ns": int(span["startTimeUnixNano"]),
                        "end_ns": int(span["endTimeUnixNano"]),
                        "attributes": {
                            a["key"]: _json_value(a["value"]) for a in span.get("attributes", [])
                        },
                        "resource": resource,
                    }
                )
    return spans


@contextlib.contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP traces endpoint on a free loopback port (`receiver.url` ends in
    /v1/traces); every span it is sent lands in `receiver.spans`, duplicates included."""
    receiver = OtlpReceiver(url="")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            encoding = self.headers.get("content-encoding", "")
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            content_type = self.headers.get("content-type", "")
            arrived_s = time.monotonic()
            if self.path == "/v1/metrics":
                receiver.points.extend(decode_metrics(body, content_type))
            for span in decode_export(body, content_type) if self.path != "/v1/metrics" else ():
                receiver.spans.append(
                    ReceivedSpan(
                        **span,
                        arrived_s=arrived_s,
                        content_type=content_type,
                        content_encoding=encoding,
                    )
                )
            self.send_response(200)
            self.send_header("content-type", content_type or "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:  # keep pytest output clean
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def standin_server(engine: str, scratch: Path, **settings: object) -> Iterator[str]:
    """`uvicorn --factory tests.helpers.engine_standins:create_app` for `engine`; each keyword
    is an LLM_SLO_STANDIN_* setting (`queue_s=0.5` sets LLM_SLO_STANDIN_QUEUE_S). Yields the
    base URL; its output goes to a log in `scratch`, shown if it fails to start."""
    port = free_port()
    env = {**os.environ, "LLM_SLO_STANDIN_ENGINE": engine}
    env |= {f"LLM_SLO_STANDIN_{name.upper()}": str(value) for name, value in settings.items()}
    command = [sys.executable, "-m", "uvicorn", "--factory",
               "tests.helpers.engine_standins:create_app", "--host", "127.0.0.1",
               "--port", str(port), "--log-level", "warning"]  # fmt: skip
    log_path = scratch / f"standin-{engine}-{port}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until_ready(base_url + "/health", timeout_s=60, process=process)
        except (RuntimeError, AssertionError) as error:
            raise AssertionError(f"{error}; its output:\n{log_path.read_text()}") from None
        yield base_url
    finally:
        stop_process(process)
