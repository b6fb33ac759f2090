"""Where the clock starts. A client trickles its request's header lines 100 ms apart: `slo
proxy`, whose protocol reads the first byte, counts the trickle in e2e and network (and apart,
in `before_app_s`), while the mounted middleware, which starts at the ASGI call, says so in its
record (`clock_start`)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from middleware import LatencyMiddleware
from middleware.request.arrival import put_first_byte
from slo.sli import PHASE_FIELDS
from tests.helpers.proxy_process import slo_proxy
from tests.helpers.proxy_upstream import OpenAIUpstream
from tests.helpers.record_rows import records
from tests.helpers.servers import uvicorn_thread

pytestmark = pytest.mark.integration

PAUSE_S = 0.1


def trickle(base_url: str, pause_s: float = PAUSE_S) -> tuple[bytes, float]:
    """POST a completion whose request line and header lines leave one by one, `pause_s`
    apart; (the response's bytes, the seconds the request took to leave)."""
    body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 3}).encode()
    lines = [
        b"POST /v1/completions HTTP/1.1\r\n",
        b"host: 127.0.0.1\r\n",
        b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(body),
        b"connection: close\r\n",
        b"\r\n" + body,
    ]
    address = urlsplit(base_url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as client:
        started = time.perf_counter()
        for index, line in enumerate(lines):
            if index:
                time.sleep(pause_s)
            client.sendall(line)
        sent_s = time.perf_counter() - started
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    return answer, sent_s


@pytest.fixture
def upstream_url() -> Iterator[str]:
    with uvicorn_thread(OpenAIUpstream()) as base_url:
        yield base_url


def test_the_proxy_clock_starts_at_the_first_byte(upstream_url: str, tmp_path: Path) -> None:
    db = tmp_path / "records.db"
    with slo_proxy(upstream_url, db) as base_url:
        answer, trickle_s = trickle(base_url)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert trickle_s >= 5 * PAUSE_S
    (row,) = records(db)
    assert row["clock_start"] == "first_byte"
    # The trickle is the client's wait too: in e2e, in network, and apart before the app.
    assert row["e2e_s"] >= trickle_s - PAUSE_S  # the body line left with the last pause
    assert row["before_app_s"] >= 4 * PAUSE_S and row["network_s"] >= row["before_app_s"]
    assert sum(row[name] or 0.0 for name in PHASE_FIELDS) == pytest.approx(row["e2e_s"], abs=1e-6)
    assert row["connection_s"] is not None and 0 <= row["connection_s"] < PAUSE_S


def test_the_mounted_middleware_says_its_clock_starts_at_the_call(tmp_path: Path) -> None:
    db = tmp_path / "records.db"
    app = LatencyMiddleware(OpenAIUpstream(), store=f"sqlite:///{db}", model="m")
    with uvicorn_thread(app, health_path="/metrics") as base_url:
        answer, trickle_s = trickle(base_url)
    app.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    (row,) = records(db)
    assert row["clock_start"] == "asgi_call"
    assert row["before_app_s"] is None and row["connection_s"] is None
    assert row["e2e_s"] < trickle_s - 3 * PAUSE_S  # uvicorn read the headers before the call


def test_a_server_hands_the_first_byte_over_through_the_scope(tmp_path: Path) -> None:
    """The documented extension, from any server: a first byte 50 ms before the call."""
    db = tmp_path / "records.db"
    inner = LatencyMiddleware(OpenAIUpstream(), store=f"sqlite:///{db}", model="m")

    async def server_side(scope, receive, send):  # what a server that read the byte does
        if scope["type"] == "http":
            put_first_byte(scope, time.perf_counter_ns() - 50_000_000, None)
        await inner(scope, receive, send)

    with uvicorn_thread(server_side, health_path="/metrics") as base_url:
        answer, _ = trickle(base_url, pause_s=0.0)
    inner.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    (row,) = records(db)
    assert row["clock_start"] == "first_byte" and row["connection_s"] is None
    assert row["before_app_s"] == pytest.approx(0.05, abs=0.01)
    assert row["e2e_s"] >= 0.05
