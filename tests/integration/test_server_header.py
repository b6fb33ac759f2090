"""`slo serve --server-header`: every response, errors and uvicorn's own answers to bytes that are
not HTTP included, carries our Server header (or none), never uvicorn's name. A value of one's
own is checked by the schemathesis run (tests/integration/test_api_schemathesis.py)."""

from __future__ import annotations

import socket

import httpx
import pytest

from tests.helpers.servers import slo_serve

pytest.importorskip("torch")

pytestmark = pytest.mark.integration


def _raw_reply(base_url: str) -> str:
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        return raw.recv(65536).decode("latin-1")


@pytest.mark.parametrize(("flag", "expected"), [(None, "llm-slo"), ("", None)])
def test_server_header_is_ours(flag: str | None, expected: str | None) -> None:
    args = ["--no-middleware"] + ([] if flag is None else ["--server-header", flag])
    with slo_serve(*args) as base_url:
        answers = [
            httpx.get(base_url + "/health", timeout=30),
            httpx.get(base_url + "/no/such/route", timeout=30),
            httpx.post(base_url + "/v1/completions", content=b"{", timeout=30),
        ]
        raw = _raw_reply(base_url)
    for answer in answers:
        assert answer.headers.get_list("server") == ([] if expected is None else [expected])
    assert raw.startswith("HTTP/1.1 400"), raw
    assert "uvicorn" not in raw.lower()
    assert (f"server: {expected}\r\n" in raw.lower()) == (expected is not None), raw
