"""`slo serve` (the bundled engine) with every security flag at once: TLS 1.3 only, the
operations token, a per-address limit. The proxy's tests cover each rule in depth; this one
checks that serve wires the same parts: the handshake, the token on the ops endpoints and not
on the API, the 429 with Retry-After, and the refusal recorded as one."""

from __future__ import annotations

import contextlib
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("torch")

from slo.cli.bench.server import free_port, stop_process
from tests.helpers.record_rows import records
from tests.helpers.tls import Pki, make_pki, wait_until_https_ready

pytestmark = pytest.mark.integration

TOKEN = "serve-ops-token-0123456789"
LIMIT = 4


@contextlib.contextmanager
def secure_serve(pki: Pki, tmp_path: Path) -> Iterator[str]:
    token = tmp_path / "ops-token"
    token.write_text(TOKEN + "\n")
    port = free_port()
    command = [
        sys.executable, "-m", "slo.cli", "serve", "--model", "bundled:tiny",
        "--host", "127.0.0.1", "--port", str(port),
        "--store", f"sqlite:///{tmp_path / 'records.db'}",
        "--ssl-certfile", str(pki.server_cert), "--ssl-keyfile", str(pki.server_key),
        "--ssl-min-version", "1.3", "--ops-token-file", str(token),
        "--ip-requests-per-minute", str(LIMIT),
    ]  # fmt: skip
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"https://127.0.0.1:{port}"
    try:
        # /metrics: behind the token (401 counts as up) and not counted against the address
        wait_until_https_ready(url + "/metrics", pki.client_context(), timeout_s=180, process=child)
        yield url
    finally:
        stop_process(child)
        output = child.stdout.read() if child.stdout is not None else ""
        if child.stdout is not None:
            child.stdout.close()
        assert child.returncode == 0, output


def test_slo_serve_with_tls_token_and_address_limit(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    with secure_serve(pki, tmp_path) as url:
        only_12 = pki.client_context()
        only_12.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/metrics", verify=only_12)
        with httpx.Client(verify=pki.client_context()) as client:
            assert client.get(url + "/metrics").status_code == 401
            assert client.get(url + "/slo").status_code == 401
            bearer = {"authorization": f"Bearer {TOKEN}"}
            assert client.get(url + "/metrics", headers=bearer).status_code == 200
            assert client.get(url + "/slo", headers=bearer).status_code == 200
            body = {"model": "bundled:tiny", "prompt": "hello", "max_tokens": 2}
            answers = [client.post(url + "/v1/completions", json=body) for _ in range(LIMIT + 1)]
    assert [a.status_code for a in answers] == [200] * LIMIT + [429]
    refused = answers[-1]
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["type"] == "rate_limit_error"
    rows = records(tmp_path / "records.db")
    assert [row["status_code"] for row in rows] == [200] * LIMIT + [429]
