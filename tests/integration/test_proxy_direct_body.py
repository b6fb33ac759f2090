"""`slo proxy`'s server protocol (slo.cli.proxy.direct) on a real uvicorn, in front of a real
upstream: the stream's middle pieces are written straight from the upstream connection's
callback and measured as if sent; a client that stops reading makes the server push back, the
pieces then go through `send` (and its drain), and the client still gets every byte in order."""

from __future__ import annotations

import contextlib
import json
import socket
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httptools
import httpx
import pytest

from middleware import LatencyMiddleware
from middleware.proxy import ProxyApp
from middleware.wire.direct_body import EXTENSION
from slo.cli.proxy.direct import DirectBodyProtocol
from tests.helpers.proxy_upstream import OpenAIUpstream
from tests.helpers.servers import uvicorn_thread

pytestmark = pytest.mark.integration

TABLE = "llm_slo_request_records"


def _counting_protocol(counts: Counter[str]) -> type[DirectBodyProtocol]:
    """The real protocol, its offers' writes and refusals counted (whether a piece comes
    through the one-call `offer` or through `ready` and `write`)."""

    class Counting(DirectBodyProtocol):
        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            offer = self.scope.get("extensions", {}).get(EXTENSION)
            if offer is None:
                return
            write, ready, one_call = offer.write, offer.ready, offer.offer

            def counted_write(body: bytes) -> None:
                counts["direct"] += 1
                write(body)

            def counted_ready() -> bool:
                answer = ready()
                counts["ready" if answer else "refused"] += 1
                return answer

            def counted_offer(body: bytes) -> bool:
                taken = one_call(body)
                counts["direct" if taken else "refused"] += 1
                return taken

            offer.write, offer.ready, offer.offer = counted_write, counted_ready, counted_offer

    return Counting


@contextlib.contextmanager
def proxy(upstream_url: str, db: Path, counts: Counter[str]) -> Iterator[str]:
    app = LatencyMiddleware(ProxyApp(upstream_url), store=f"sqlite:///{db}", model="m")
    with uvicorn_thread(app, "/metrics", http=_counting_protocol(counts)) as base_url:
        yield base_url


def records(db: Path) -> list[dict[str, object]]:
    with contextlib.closing(sqlite3.connect(db)) as connection:
        connection.row_factory = sqlite3.Row
        return [dict(row) for row in connection.execute(f"SELECT * FROM {TABLE}")]


def _request(tokens: int, per_write: int = 1, itl_s: float = 0.0) -> dict[str, object]:
    return {
        "json": {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": tokens,
            "stream": True,
        },
        "headers": {"x-test-events-per-write": str(per_write), "x-test-itl-s": str(itl_s)},
    }


@pytest.mark.parametrize("per_write", [1, 3])
def test_stream_pieces_go_straight_to_the_client_and_are_measured(
    tmp_path: Path, per_write: int
) -> None:
    counts: Counter[str] = Counter()
    tokens = 24
    db = tmp_path / "records.db"
    with uvicorn_thread(OpenAIUpstream()) as upstream_url, proxy(upstream_url, db, counts) as url:
        response = httpx.post(url + "/v1/chat/completions", **_request(tokens, per_write, 0.002))
        assert response.status_code == 200
    texts = [
        json.loads(event[len("data: ") :])["choices"][0]["delta"].get("content")
        for event in response.text.split("\n\n")
        if event.startswith("data: {")
    ]
    assert texts[1:-1] == [f" t{index}" for index in range(tokens)]
    assert response.text.rstrip().endswith("}")  # the timings comment came with the end
    assert "data: [DONE]" in response.text
    # every write but the first (it came with the headers, before the offer was taken)
    writes = -(-(tokens + 3) // per_write)
    assert writes - 2 <= counts["direct"] <= writes
    (row,) = records(db)
    assert row["output_tokens"] == tokens
    assert len(json.loads(str(row["itl_s"]))) == tokens - 1  # N content events, N-1 gaps
    assert row["outcome"] == "ok"


class _Body:
    """The response's body, de-chunked by httptools (pieces may split events anywhere)."""

    def __init__(self) -> None:
        self.body = bytearray()
        self.complete = False

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


def _read_stream(sock: socket.socket) -> bytes:
    reader = _Body()
    parser = httptools.HttpResponseParser(reader)
    while not reader.complete:
        piece = sock.recv(65536)
        assert piece, "the proxy closed the connection before the stream's end"
        parser.feed_data(piece)
    return bytes(reader.body)


def test_a_client_that_stops_reading_still_gets_every_byte_in_order(tmp_path: Path) -> None:
    counts: Counter[str] = Counter()
    tokens = 20000  # about 3 MB: more than the sockets between them hold
    db = tmp_path / "records.db"
    body = json.dumps(_request(tokens)["json"]).encode()
    with uvicorn_thread(OpenAIUpstream()) as upstream_url, proxy(upstream_url, db, counts) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            time.sleep(1.0)  # not reading: the proxy's writes back up
            received = _read_stream(sock)
        deadline = time.monotonic() + 10
        while not records(db) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert counts["refused"] >= 1, counts  # the server pushed back at least once
    assert counts["direct"] >= 1, counts
    text = received.decode()
    positions = [text.find(f'"content": " t{index}"') for index in range(0, tokens, 997)]
    assert -1 not in positions and positions == sorted(positions)
    assert text.count('"content": " t') == tokens
    assert "data: [DONE]" in text
    (row,) = records(db)
    assert row["output_tokens"] == tokens and row["outcome"] == "ok"
