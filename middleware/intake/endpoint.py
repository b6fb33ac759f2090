"""`POST /v1/traces`: OTLP/HTTP trace exports from the engine, handed to the span join.

Answers as an OTLP/HTTP receiver does: 200 with an empty `ExportTraceServiceResponse` (in
the request's encoding) once the export is read, 400 with a message naming what is wrong,
405 for another method, 413 past the size limit. An export is read whole before any of its
spans is joined, so a malformed body changes nothing.
"""

from __future__ import annotations

import json

from middleware.intake.join import SpanJoin
from middleware.intake.otlp import MAX_EXPORT_BYTES, IntakeError, decode_export
from middleware.types import Receive, Scope, Send


async def serve_traces(join: SpanJoin, scope: Scope, receive: Receive, send: Send) -> None:
    headers = {
        key.decode("latin-1").lower(): value.decode("latin-1")
        for key, value in scope.get("headers", ())
    }
    content_type = headers.get("content-type", "")
    as_json = content_type.split(";")[0].strip().lower() == "application/json"
    if scope.get("method") != "POST":
        await _answer(send, 405, "POST an OTLP/HTTP trace export here", as_json)
        return
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return  # the exporter went away
        body += message.get("body", b"")
        if len(body) > MAX_EXPORT_BYTES:
            join.counts.rejected += 1
            await _answer(send, 413, f"export exceeds {MAX_EXPORT_BYTES} bytes", as_json)
            return
        if not message.get("more_body", False):
            break
    try:
        take_export(join, bytes(body), content_type, headers.get("content-encoding", ""))
    except IntakeError as error:
        await _answer(send, 400, f"POST /v1/traces: {error}", as_json)
        return
    await _answer(send, 200, None, as_json)


def take_export(join: SpanJoin, body: bytes, content_type: str, content_encoding: str = "") -> None:
    """Read one export whole, then hand its spans to the join: an export that cannot be read
    (IntakeError, past the size limit too) is counted as rejected and changes nothing. Both
    intakes, OTLP/HTTP here and OTLP/gRPC (`middleware.intake.grpc_server`), take it so."""
    try:
        if len(body) > MAX_EXPORT_BYTES:
            raise IntakeError(f"export exceeds {MAX_EXPORT_BYTES} bytes; send smaller batches")
        spans = decode_export(body, content_type, content_encoding, join.wanted)
    except IntakeError:
        join.counts.rejected += 1
        raise
    join.add(spans)


async def _answer(send: Send, status: int, message: str | None, as_json: bool) -> None:
    if as_json or message is not None:
        # OTLP/HTTP answers a failure with a google.rpc.Status; its JSON form has `message`.
        payload = {} if message is None else {"code": 3, "message": message}
        body, content_type = json.dumps(payload).encode(), b"application/json"
    else:
        body, content_type = b"", b"application/x-protobuf"  # an empty response message
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type)],
        }
    )
    await send({"type": "http.response.body", "body": body})
