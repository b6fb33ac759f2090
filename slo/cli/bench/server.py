"""`slo serve` as a child process on a free loopback port (`slo bench --embedded`, `slo demo`).

A child process rather than a thread: the SLO core never imports the engine (only `slo serve`
does), and the benchmark's own event loop and the engine's then never compete for one GIL,
so the client's timings are not skewed by the server's work.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

from slo.errors import UsageError


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(
    process: subprocess.Popen[bytes] | subprocess.Popen[str], timeout_s: float = 30
) -> None:
    """SIGTERM (a graceful drain for `slo serve`), then SIGKILL if it does not end in time."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def embedded_server(
    *,
    model: str = "bundled:tiny",
    spec: str | None = None,
    store: str | None = None,
    startup_timeout_s: float = 180.0,
    extra_args: Sequence[str] = (),
) -> Iterator[str]:
    """Yield the base URL of a running `slo serve`; stop it on exit.

    Without `store`, the server's own records go to a temporary SQLite file that is removed
    afterwards (the benchmark writes its own, richer, records).
    """
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="slo-bench-") as scratch:
        log_path = Path(scratch) / "serve.log"
        command = [
            sys.executable,
            "-m",
            "slo.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model",
            model,
            "--store",
            store or f"sqlite:///{Path(scratch) / 'records.db'}",
        ]
        if spec:
            command += ["--spec", spec]
        command += list(extra_args)  # more `slo serve` flags (the overload demo's --scheduling)
        with log_path.open("w") as log:
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ}
            )
        base_url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(base_url, process, log_path, startup_timeout_s)
            yield base_url
        finally:
            stop_process(process)


def _wait_ready(
    base_url: str, process: subprocess.Popen[bytes], log_path: Path, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-8:]
            raise UsageError(
                f"--embedded: `slo serve` exited with {process.returncode} before it was ready "
                "(the bundled engine needs `pip install 'llm-slo[engine]'`):\n  "
                + "\n  ".join(tail)
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base_url + "/health", timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    raise UsageError(f"--embedded: `slo serve` was not ready after {timeout_s:.0f} s")
