"""What llm-slo calls out to, over TLS and with a bearer token: the live evaluator's push to a
real Alertmanager serving HTTPS (its --web.config.file), `slo check --prometheus` against a real
Prometheus serving HTTPS, each verified against the test's CA from the environment and refused
without it; and the bearer token from a file, seen by an HTTPS server that demands it (neither
Prometheus nor Alertmanager checks bearer tokens themselves: an authenticating proxy in front
of them does, which this server stands for)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from middleware.live.alerting import push_to_alertmanager
from slo.cli.bench.server import free_port
from slo.cli.check import prometheus_reader
from slo.errors import UsageError
from tests.helpers.binaries import binary
from tests.helpers.tls import Pki, wait_until_https_ready

pytestmark = pytest.mark.integration

TOKEN = "outbound-token-42"
ALERT = {"labels": {"alertname": "TLSPushTest", "tier": "premium"}, "annotations": {}}


def _web_config(pki: Pki, directory: Path) -> Path:
    path = directory / "web.yml"
    tls = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}
    path.write_text(json.dumps({"tls_server_config": tls}))  # JSON is YAML
    return path


@contextlib.contextmanager
def https_alertmanager(pki: Pki, tmp_path: Path) -> Iterator[str]:
    config = tmp_path / "alertmanager.yml"
    config.write_text(json.dumps({"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}))
    port = free_port()
    command = [
        binary("prometheus-alertmanager", "alertmanager"),
        f"--config.file={config}",
        f"--storage.path={tmp_path / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--web.config.file={_web_config(pki, tmp_path)}",
        "--cluster.listen-address=",
    ]
    url = f"https://127.0.0.1:{port}"
    with _https_process(command, url + "/-/ready", tmp_path / "alertmanager.log", pki):
        yield url


@contextlib.contextmanager
def _https_process(command: list[str], ready: str, log: Path, pki: Pki) -> Iterator[None]:
    import subprocess

    from slo.cli.bench.server import stop_process

    with log.open("w") as output:
        child = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        try:
            wait_until_https_ready(ready, pki.client_context(), process=child)
            yield
        finally:
            stop_process(child, timeout_s=20)


def test_alertmanager_push_verifies_against_the_ca_from_the_environment(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with https_alertmanager(pki, tmp_path) as url:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            push_to_alertmanager(url, [ALERT], 1.0)  # the system's CAs do not know the test CA
        monkeypatch.setenv("LLM_SLO_ALERTMANAGER_CA_FILE", str(pki.ca))
        push_to_alertmanager(url, [ALERT], 1.0)
        alerts = httpx.get(url + "/api/v2/alerts", verify=pki.client_context()).json()
        assert [a["labels"]["alertname"] for a in alerts] == ["TLSPushTest"]


def test_prometheus_queries_verify_against_the_ca(pki: Pki, tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({"global": {"scrape_interval": "1s"}, "scrape_configs": []}))
    command = [
        binary("prometheus"),
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'prom-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--web.config.file={_web_config(pki, tmp_path)}",
    ]
    url = f"https://127.0.0.1:{port}"
    with _https_process(command, url + "/-/ready", tmp_path / "prometheus.log", pki):
        reader = prometheus_reader(url, ca_file=str(pki.ca))
        assert reader.query("vector(7)") == [({}, 7.0)]
        reader.close()
        unverified = prometheus_reader(url)
        with pytest.raises(UsageError, match="LLM_SLO_PROMETHEUS_CA_FILE"):
            unverified.query("vector(7)")
        unverified.close()


class _Gate:
    """An HTTPS server that answers only `Authorization: Bearer TOKEN`, as an authenticating
    proxy in front of Prometheus or Alertmanager does; records what it saw."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = dict(scope["headers"])
        self.seen.append(headers.get(b"authorization", b"").decode())
        ok = headers.get(b"authorization") == f"Bearer {TOKEN}".encode()
        body = (
            json.dumps(
                {"status": "success", "data": {"result": [{"metric": {}, "value": [0, "3"]}]}}
            )
            if ok
            else "unauthorized"
        ).encode()
        await send({"type": "http.response.start", "status": 200 if ok else 401, "headers": []})
        await send({"type": "http.response.body", "body": body})


@contextlib.contextmanager
def gate(pki: Pki) -> Iterator[tuple[_Gate, str]]:
    import uvicorn

    app = _Gate()
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
            ssl_certfile=str(pki.server_cert),
            ssl_keyfile=str(pki.server_key),
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"https://127.0.0.1:{port}"
    try:
        wait_until_https_ready(url, pki.client_context())
        yield app, url
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_bearer_tokens_from_files(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    monkeypatch.setenv("LLM_SLO_ALERTMANAGER_CA_FILE", str(pki.ca))
    monkeypatch.setenv("LLM_SLO_PROMETHEUS_CA_FILE", str(pki.ca))
    with gate(pki) as (app, url):
        anonymous = prometheus_reader(url)
        with pytest.raises(UsageError, match=r"answered 401: .*LLM_SLO_PROMETHEUS_TOKEN_FILE"):
            anonymous.query("up")
        anonymous.close()
        reader = prometheus_reader(url, token_file=str(token))
        assert reader.query("up") == [({}, 3.0)]
        reader.close()
        with pytest.raises(httpx.HTTPStatusError):
            push_to_alertmanager(url, [ALERT], 1.0)
        monkeypatch.setenv("LLM_SLO_ALERTMANAGER_TOKEN_FILE", str(token))
        push_to_alertmanager(url, [ALERT], 1.0)
        assert app.seen[-1] == f"Bearer {TOKEN}"
