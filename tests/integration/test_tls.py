"""TLS on `slo proxy` (and so `slo serve`: one runner, one context): real handshakes against
the real CLI, with a CA, server and client certificates made in the test.

The TLS 1.3 handshake with httpx and `openssl s_client`; TLS 1.1 (and 1.2 under
--ssl-min-version 1.3) refused by the server, not the client; plain HTTP to the TLS port fails
at once; mTLS without a client certificate refused; the proxy in front of a TLS upstream,
verifying it with --upstream-ca-certs and refusing one it cannot verify; the openai client
streaming through TLS on both sides with the records right; and a certificate that cannot
serve stops the CLI with one line naming the file.
"""

from __future__ import annotations

import datetime
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from slo.cli.bench.server import free_port, stop_process
from tests.helpers.binaries import binary
from tests.helpers.https_upstream import tls_upstream
from tests.helpers.polling import wait_until_ready
from tests.helpers.proxy_process import tls_proxy
from tests.helpers.record_rows import records
from tests.helpers.tls import Pki, issue, make_pki

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def upstream(pki: Pki) -> Iterator[str]:
    with tls_upstream(pki) as url:
        yield url


@pytest.fixture(scope="module")
def proxy(pki: Pki, upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = tmp_path_factory.mktemp("proxy") / "records.db"
    with tls_proxy(pki, upstream, db, "--upstream-ca-certs", str(pki.ca)) as url:
        yield url


def _negotiated(url: str, context: ssl.SSLContext) -> str:
    with httpx.Client(verify=context) as client, client.stream("GET", url + "/metrics") as answer:
        assert answer.status_code == 200
        return str(answer.extensions["network_stream"].get_extra_info("ssl_object").version())


def _openssl(port: int, *args: str) -> subprocess.CompletedProcess[str]:
    command = [binary("openssl"), "s_client", "-connect", f"127.0.0.1:{port}", *args]
    return subprocess.run(
        command, input="", capture_output=True, text=True, timeout=20, check=False
    )


def test_tls13_handshake_with_httpx_and_openssl(pki: Pki, proxy: str) -> None:
    only_13 = pki.client_context()
    only_13.minimum_version = ssl.TLSVersion.TLSv1_3
    assert _negotiated(proxy, only_13) == "TLSv1.3"
    port = int(proxy.rsplit(":", 1)[1])
    result = _openssl(port, "-tls1_3", "-CAfile", str(pki.ca), "-verify_return_error")
    assert result.returncode == 0, result.stderr
    assert "TLSv1.3" in result.stdout
    assert "Verify return code: 0 (ok)" in result.stdout


def test_tls11_is_refused_by_the_server(proxy: str) -> None:
    port = int(proxy.rsplit(":", 1)[1])
    # SECLEVEL=0 lets this client offer TLS 1.1 at all; the refusal must be the server's.
    result = _openssl(port, "-tls1_1", "-cipher", "DEFAULT@SECLEVEL=0")
    assert result.returncode != 0
    # The server ends the handshake (an alert or a plain close); no session comes of it.
    assert "Cipher is (NONE)" in result.stdout, result.stdout
    assert "TLSv1.1" not in result.stdout.split("---")[-1]
    assert "no protocols available" not in result.stderr  # the client did offer 1.1


def test_min_version_13_refuses_tls12(pki: Pki, upstream: str, tmp_path: Path) -> None:
    args = ("--upstream-ca-certs", str(pki.ca), "--ssl-min-version", "1.3")
    with tls_proxy(pki, upstream, tmp_path / "r.db", *args) as url:
        only_12 = pki.client_context()
        only_12.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(httpx.ConnectError):  # the server ends the handshake
            httpx.get(url + "/metrics", verify=only_12)
        assert _negotiated(url, pki.client_context()) == "TLSv1.3"


def test_plain_http_to_the_tls_port_fails_fast(proxy: str) -> None:
    started = time.monotonic()
    with pytest.raises(httpx.HTTPError):
        httpx.get(proxy.replace("https://", "http://") + "/metrics", timeout=10)
    assert time.monotonic() - started < 2.0


def test_mtls_needs_a_client_certificate(pki: Pki, upstream: str, tmp_path: Path) -> None:
    args = ("--upstream-ca-certs", str(pki.ca), "--ssl-ca-certs", str(pki.ca))
    with tls_proxy(pki, upstream, tmp_path / "r.db", *args) as url:
        with pytest.raises(httpx.HTTPError):  # TLS 1.3: the refusal arrives at the first read
            httpx.get(url + "/metrics", verify=pki.client_context())
        answer = httpx.get(url + "/metrics", verify=pki.client_context(with_client_cert=True))
        assert answer.status_code == 200
        # A certificate from another CA is no better than none.
        stranger = make_pki(pki.directory / "stranger", prefix="stranger-")
        context = pki.client_context()
        context.load_cert_chain(stranger.client_cert, stranger.client_key)
        with pytest.raises(httpx.HTTPError):
            httpx.get(url + "/metrics", verify=context)


def test_openai_client_streams_through_tls_on_both_sides(
    pki: Pki, upstream: str, tmp_path: Path
) -> None:
    db = tmp_path / "records.db"
    expected = "".join(f" t{index}" for index in range(6))
    with tls_proxy(pki, upstream, db, "--upstream-ca-certs", str(pki.ca)) as url:
        http_client = httpx.Client(verify=pki.client_context())
        client = openai.OpenAI(
            base_url=url + "/v1", api_key="unused", max_retries=0, http_client=http_client
        )
        chat = [{"role": "user", "content": "hi"}]
        for _ in range(3):
            stream = client.chat.completions.create(
                model="m", messages=chat, max_tokens=6, stream=True
            )
            assert "".join(c.choices[0].delta.content or "" for c in stream) == expected
        reply = client.completions.create(model="m", prompt="hi", max_tokens=6)
        assert reply.choices[0].text == expected
        http_client.close()
    rows = records(db)
    assert [row["outcome"] for row in rows] == ["ok"] * 4
    assert [row["route"] for row in rows] == ["/v1/chat/completions"] * 3 + ["/v1/completions"]
    assert [row["output_tokens"] for row in rows] == [6] * 4
    assert all(float(row["ttft_s"]) > 0 for row in rows)  # type: ignore[arg-type]


def test_an_upstream_it_cannot_verify_is_refused(pki: Pki, upstream: str, tmp_path: Path) -> None:
    db = tmp_path / "records.db"
    with tls_proxy(pki, upstream, db) as url:  # system CAs only: the test CA is unknown
        answer = httpx.post(
            url + "/v1/completions",
            json={"model": "m", "prompt": "hi", "max_tokens": 2},
            verify=pki.client_context(),
        )
        assert answer.status_code == 502
        assert "cannot be verified" in answer.json()["error"]["message"]
    assert [row["status_code"] for row in records(db)] == [502]


def test_an_upstream_that_asks_for_a_client_certificate(pki: Pki, tmp_path: Path) -> None:
    body = {"model": "m", "prompt": "hi", "max_tokens": 2}
    with tls_upstream(pki, client_certificates=True) as upstream:
        trusted = ("--upstream-ca-certs", str(pki.ca))
        with tls_proxy(pki, upstream, tmp_path / "without.db", *trusted) as url:
            answer = httpx.post(url + "/v1/completions", json=body, verify=pki.client_context())
            assert answer.status_code == 502  # the upstream ended the handshake
        mtls = (*trusted, "--upstream-certfile", str(pki.client_cert))
        mtls += ("--upstream-keyfile", str(pki.client_key))
        with tls_proxy(pki, upstream, tmp_path / "with.db", *mtls) as url:
            answer = httpx.post(url + "/v1/completions", json=body, verify=pki.client_context())
            assert answer.status_code == 200, answer.text


def test_upstream_insecure_is_explicit_and_says_so(pki: Pki, upstream: str, tmp_path: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "slo.cli", "proxy", "--upstream", upstream, "--port"]
    command += [str(port), "--store", f"sqlite:///{tmp_path / 'r.db'}", "--upstream-insecure"]
    command += ["--upstream-metrics", "off", "--provider-name", "test"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_ready(url + "/metrics", process=child)
        body = {"model": "m", "prompt": "hi", "max_tokens": 2}
        assert httpx.post(url + "/v1/completions", json=body).status_code == 200
    finally:
        stop_process(child)
    _, stderr = child.communicate()
    assert f"warning: --upstream-insecure: the certificate of {upstream} is not verified" in stderr
    line = _cli_error("--upstream-insecure")  # with an http:// upstream: a mistake
    assert "--upstream-insecure needs an https:// --upstream" in line


def _cli_error(*args: str) -> str:
    command = [sys.executable, "-m", "slo.cli", "proxy", "--upstream", "http://127.0.0.1:9"]
    result = subprocess.run(
        [*command, "--port", str(free_port()), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_a_certificate_that_cannot_serve_is_one_line_naming_the_file(
    pki: Pki, tmp_path: Path
) -> None:
    expired_at = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=10)
    _, _, old_cert, old_key = issue(tmp_path, "old", None, None, not_before=expired_at, days=2)
    line = _cli_error("--ssl-certfile", str(old_cert), "--ssl-keyfile", str(old_key))
    assert str(old_cert) in line and "expired" in line and "renew" in line
    line = _cli_error("--ssl-certfile", str(pki.server_cert), "--ssl-keyfile", str(old_key))
    assert str(old_key) in line and "not the key of the certificate" in line
    missing = tmp_path / "missing.pem"
    line = _cli_error("--ssl-certfile", str(missing))
    assert str(missing) in line and "no such file" in line
    unreadable = tmp_path / "unreadable.crt"
    unreadable.write_bytes(pki.server_cert.read_bytes())
    unreadable.chmod(0)
    if _can_read(unreadable):  # root reads anything: that case cannot be made here
        return
    line = _cli_error("--ssl-certfile", str(unreadable), "--ssl-keyfile", str(pki.server_key))
    assert str(unreadable) in line and "permission denied" in line


def _can_read(path: Path) -> bool:
    try:
        path.read_bytes()
    except PermissionError:
        return False
    return True
