"""Real servers on 127.0.0.1 for tests: uvicorn in a thread, or `slo serve` as a process."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

from slo.cli.bench.server import free_port, stop_process
from tests.helpers.polling import wait_until_ready


@contextlib.contextmanager
def uvicorn_thread(app: Any, health_path: str = "/health", **options: Any) -> Iterator[str]:
    """Serve an ASGI app with a real uvicorn on a free loopback port; yields the base URL.
    `options`: more uvicorn.Config settings (e.g. `http=` a protocol class)."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", **options
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base_url + health_path)
        yield base_url
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@contextlib.contextmanager
def slo_serve(*args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """Run `slo serve` (the real console script) on a free port; yields the base URL."""
    with slo_serve_process(*args, env=env) as (base_url, _process):
        yield base_url


@contextlib.contextmanager
def slo_serve_process(
    *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`slo_serve`, yielding the process too (to signal it, read its exit code or its RSS)."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "slo.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *args,
    ]
    process = subprocess.Popen(
        command,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base_url + "/health", process=process)
        yield base_url, process
    finally:
        stop_process(process)
        if process.stdout is not None:
            process.stdout.close()


@contextlib.contextmanager
def json_receiver(path: str = "") -> Iterator[tuple[str, list[Any]]]:
    """An HTTP receiver in a thread (a webhook, a stand-in Alertmanager): yields its URL (the
    base URL plus `path`) and the list every posted JSON body lands in."""
    received: list[Any] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            received.append(json.loads(body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:  # keep pytest output clean
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{path}", received
    finally:
        server.shutdown()
        server.server_close()
