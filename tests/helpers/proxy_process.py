"""`slo proxy` as a real subprocess on a free port, serving HTTP or HTTPS; stopped with SIGTERM
(records flushed), and failing the test if it did not exit cleanly."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from slo.cli.bench.server import free_port, stop_process
from tests.helpers.servers import wait_until_ready
from tests.helpers.tls import Pki, wait_until_https_ready


@contextlib.contextmanager
def slo_proxy(upstream_url: str, db: Path, *args: str) -> Iterator[str]:
    """`slo proxy` as a subprocess on a free port; stopped with SIGTERM (records flushed)."""
    port = free_port()
    command = [sys.executable, "-m", "slo.cli", "proxy", "--upstream", upstream_url]
    command += ["--port", str(port), "--store", f"sqlite:///{db}", "--model", "test-upstream"]
    child = subprocess.Popen(
        [*command, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base_url + "/metrics", process=child)  # served by the middleware
        yield base_url
    finally:
        stop_process(child)
        output = child.stdout.read() if child.stdout is not None else ""
        if child.stdout is not None:
            child.stdout.close()
        assert child.returncode == 0, output


@contextlib.contextmanager
def tls_proxy(pki: Pki, upstream_url: str, db: Path, *args: str) -> Iterator[str]:
    """`slo proxy` serving HTTPS with the test's server certificate; yields its https URL."""
    port = free_port()
    command = [sys.executable, "-m", "slo.cli", "proxy", "--upstream", upstream_url]
    command += ["--port", str(port), "--store", f"sqlite:///{db}", "--model", "tls-upstream"]
    command += ["--ssl-certfile", str(pki.server_cert), "--ssl-keyfile", str(pki.server_key)]
    command += ["--upstream-metrics", "off", "--provider-name", "test", *args]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"https://127.0.0.1:{port}"
    try:
        context = pki.client_context(with_client_cert=True)
        wait_until_https_ready(url + "/metrics", context, process=child)
        yield url
    finally:
        stop_process(child)
        output = child.stdout.read() if child.stdout is not None else ""
        if child.stdout is not None:
            child.stdout.close()
        assert child.returncode == 0, output


@contextlib.contextmanager
def slo_proxy_process(
    upstream_url: str, store: str, log: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`slo proxy` storing to `store` (a URL), its output in the file `log`, yielding its URL
    and the process, for a test that signals it itself and judges its exit; stopped with
    SIGTERM at the end if still running."""
    port = free_port()
    command = [sys.executable, "-m", "slo.cli", "proxy", "--upstream", upstream_url]
    command += ["--port", str(port), "--store", store, "--model", "test-upstream", *args]
    with log.open("wb") as output:
        child = subprocess.Popen(
            command, env={**os.environ, **(env or {})}, stdout=output, stderr=subprocess.STDOUT
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base_url + "/metrics", process=child)
        yield base_url, child
    finally:
        if child.poll() is None:
            stop_process(child)
