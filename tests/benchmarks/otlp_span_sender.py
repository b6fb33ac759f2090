"""An engine's trace exporter at a fixed pace: vLLM-shaped `llm_request` spans, OTLP/HTTP
protobuf, in batches as the SDK's BatchSpanProcessor sends them (512 spans per export).

    python -m tests.benchmarks.otlp_span_sender --url http://127.0.0.1:8080/v1/traces \
        --rate 5000 [--batch 512] [--seconds 60] --out result.json

One export is built once through the real OpenTelemetry SDK (the stand-in's vLLM span: name,
kind, resource, scope, attributes) and its protobuf encoder; each later export is that body
with fresh trace and request ids written over the old ones in place (fixed widths, so the
encoding stays valid), so every span is for a trace nobody saw and the sender's own cost stays
far below the receiver's. Exports go one after another on one keep-alive connection, as the
SDK's exporter thread sends them, each at its scheduled instant (`--rate 0`: back to back); a
late export is sent at once, so a slow receiver shows as a lower achieved rate. Runs for
`--seconds`, or until SIGTERM, then writes what it saw to `--out` as JSON. It prints `sending`
once its export is built.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import secrets
import signal
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from tests.helpers.standin_telemetry import (
    Faults,
    RequestFacts,
    Timeline,
    make_tracer,
    parent_context,
    start_request_span,
)

ENGINE = "vllm"
REQUEST_PREFIX = "chatcmpl-"  # vLLM's external id of a chat request


@dataclass
class Export:
    """One protobuf export body and where each span's ids sit in it."""

    body: bytearray
    trace_id_at: list[int]  # offsets of the 16 raw bytes of each span's trace id
    request_id_at: list[int]  # offsets of the 32 hex digits after `chatcmpl-`
    run_prefix: bytes  # the first 8 bytes of every trace id this run sends

    @property
    def spans(self) -> int:
        return len(self.trace_id_at)

    def stamp(self, number: int) -> bytes:
        """Export `number` of the run: its spans get trace ids never sent before."""
        body = self.body
        first = number * self.spans
        for index, (trace_at, request_at) in enumerate(
            zip(self.trace_id_at, self.request_id_at, strict=True)
        ):
            trace_id = self.run_prefix + (first + index).to_bytes(8, "big")
            body[trace_at : trace_at + 16] = trace_id
            body[request_at : request_at + 32] = trace_id.hex().encode()
        return bytes(body)


def build_export(spans: int, seed: int = 0) -> Export:
    """`spans` ended vLLM request spans, encoded once as the OTLP/HTTP exporter encodes them."""
    draw = random.Random(seed)
    tracer, provider = make_tracer(
        ENGINE, "http://127.0.0.1:9", "protobuf", "none", Faults("never")
    )
    ended = []
    trace_ids: list[bytes] = []
    request_hex: list[str] = []
    for _ in range(spans):
        trace_ids.append(secrets.token_bytes(16))
        request_hex.append(secrets.token_hex(16))
        traceparent = f"00-{trace_ids[-1].hex()}-{secrets.token_hex(8)}-01"
        timeline = Timeline(
            arrival_ns=time.time_ns(),
            queue_s=draw.uniform(0.0, 0.5),
            prefill_s=draw.uniform(0.01, 0.2),
            decode_s=draw.uniform(0.005, 0.03),
            prompt_tokens=draw.randint(16, 4096),
            completion_tokens=draw.randint(2, 1024),
        )
        facts = RequestFacts(
            "chat", REQUEST_PREFIX + request_hex[-1], "m", "length", {"max_tokens": 1024}
        )
        parent = parent_context(ENGINE, {"traceparent": traceparent})
        span = start_request_span(tracer, ENGINE, parent, timeline, facts)
        span.end(end_time=timeline.at(timeline.e2e_s))
        ended.append(span)
    provider.shutdown()
    body = encode_spans(ended).SerializeToString()
    trace_at = [_only(body, trace_id) for trace_id in trace_ids]
    request_at = [
        _only(body, (REQUEST_PREFIX + h).encode()) + len(REQUEST_PREFIX) for h in request_hex
    ]
    return Export(bytearray(body), trace_at, request_at, secrets.token_bytes(8))


def _only(body: bytes, needle: bytes) -> int:
    at = body.find(needle)
    if at < 0 or body.find(needle, at + 1) >= 0:
        raise AssertionError(f"{needle!r} is not in the export exactly once")
    return at


@dataclass
class Sent:
    exports: int = 0
    spans_acknowledged: int = 0  # spans of exports answered 200
    statuses: Counter[str] = field(default_factory=Counter)
    first_sent_s: float = 0.0
    last_answered_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    max_lag_s: float = 0.0  # how late the latest export left, against its schedule

    def summary(self, rate: float, batch: int) -> dict[str, object]:
        latencies = sorted(self.latencies_s) or [0.0]
        elapsed_s = max(self.last_answered_s - self.first_sent_s, 1e-9)
        return {
            "offered_spans_per_s": rate,
            "spans_per_export": batch,
            "exports": self.exports,
            "spans_acknowledged": self.spans_acknowledged,
            "statuses": dict(self.statuses),
            "elapsed_s": round(elapsed_s, 3),
            "achieved_spans_per_s": round(self.spans_acknowledged / elapsed_s, 1),
            "export_ms_p50": round(statistics.median(latencies) * 1e3, 2),
            "export_ms_p99": round(latencies[int(0.99 * (len(latencies) - 1))] * 1e3, 2),
            "export_ms_max": round(latencies[-1] * 1e3, 2),
            "max_lag_ms": round(self.max_lag_s * 1e3, 2),
        }


def send(url: str, export: Export, rate: float, seconds: float | None, stop: list[bool]) -> Sent:
    """Post exports at `rate` spans/s until `seconds` pass or `stop[0]` is set."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)
    headers = {"Content-Type": "application/x-protobuf"}
    interval_s = export.spans / rate if rate > 0 else 0.0
    sent = Sent()
    started = time.perf_counter()
    sent.first_sent_s = started
    while not stop[0]:
        due = started + sent.exports * interval_s
        # Paced: a fixed number of exports, by schedule; back to back: until the time is up.
        if (
            seconds is not None
            and (due if interval_s else time.perf_counter()) - started >= seconds
        ):
            break
        body = export.stamp(sent.exports)
        if (wait_s := due - time.perf_counter()) > 0:
            time.sleep(wait_s)
        leaving = time.perf_counter()
        sent.max_lag_s = max(sent.max_lag_s, leaving - due)
        try:
            connection.request("POST", parts.path or "/v1/traces", body=body, headers=headers)
            response = connection.getresponse()
            response.read()
            status = str(response.status)
        except (OSError, http.client.HTTPException) as error:
            status = type(error).__name__  # the receiver went away: stop and say so
            stop[0] = True
        sent.last_answered_s = time.perf_counter()
        sent.latencies_s.append(sent.last_answered_s - leaving)
        sent.statuses[status] += 1
        sent.exports += 1
        if status == "200":
            sent.spans_acknowledged += export.spans
    connection.close()
    return sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--rate", type=float, required=True, help="spans/s; 0: back to back")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    stop = [False]

    def on_term(_signal: int, _frame: FrameType | None) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on_term)
    export = build_export(args.batch)
    print("sending", flush=True)  # the caller waits for this line before it starts its clock
    sent = send(args.url, export, args.rate, args.seconds, stop)
    args.out.write_text(json.dumps(sent.summary(args.rate, args.batch)))


if __name__ == "__main__":
    main()
