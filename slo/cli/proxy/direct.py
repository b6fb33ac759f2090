"""uvicorn's httptools protocol, offering each response's streamed body pieces a direct write.

`slo proxy` serves on this protocol (`http="slo.cli.proxy.direct:DirectBodyProtocol"`): per
request it puts a `middleware.wire.direct_body.DirectBody` in `scope["extensions"]`, valid for
the request's own `send`, whose `write` frames a piece as uvicorn's `send` does (one HTTP/1.1
chunk) and hands it to the transport. uvicorn's response state (started, chunked, complete,
keep-alive) stays uvicorn's: the start and the end of every response still go through
`send`, and `ready` says no whenever `send` would do more than that one write (not started,
not chunked, finished, client gone, or the client's socket pushing back, when `send` would
wait for it to drain).

It also tells the middleware when each request's first byte was read, and when a new
connection was accepted (`middleware.request.arrival`): the proxy's clock starts at the first
byte, not once uvicorn has read and parsed the headers and called the app.
"""

from __future__ import annotations

import asyncio
import time

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from middleware.request.arrival import put_first_byte
from middleware.wire.direct_body import DirectBody, put_direct_body


class DirectBodyProtocol(HttpToolsProtocol):
    # When the bytes being parsed were read, when the request being parsed began, and when the
    # connection was accepted (until its first request has it).
    _read_ns = _first_byte_ns = 0
    _accepted_ns: int | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._accepted_ns = time.perf_counter_ns()
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._read_ns = time.perf_counter_ns()
        super().data_received(data)

    def on_message_begin(self) -> None:
        self._first_byte_ns = self._read_ns  # the parser meets the request's first byte
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        # uvicorn made a new cycle for this request (not on an upgrade, which returns early)
        if cycle is not None and cycle.scope is self.scope:
            put_direct_body(self.scope, _offer(cycle))
            put_first_byte(self.scope, self._first_byte_ns, self._accepted_ns)
            self._accepted_ns = None  # later requests on the connection reuse it


def _offer(cycle: RequestResponseCycle) -> DirectBody:
    flow = cycle.flow
    write_to_client = cycle.transport.write

    def ready() -> bool:
        return (
            cycle.chunked_encoding is True
            and cycle.response_started
            and not cycle.response_complete
            and not flow.write_paused
            and not cycle.disconnected
        )

    def write(body: bytes) -> None:
        if body:
            write_to_client(b"%x\r\n%s\r\n" % (len(body), body))

    def offer(body: bytes) -> bool:  # ready, then write: one call per piece
        if (
            cycle.chunked_encoding is True
            and cycle.response_started
            and not cycle.response_complete
            and not flow.write_paused
            and not cycle.disconnected
        ):
            if body:
                write_to_client(b"%x\r\n%s\r\n" % (len(body), body))
            return True
        return False

    return DirectBody(cycle.send, ready, write, offer)
