"""llama.cpp's real C++ `llama-server --metrics` and `slo proxy` in front of it, as processes
on 127.0.0.1, for tests/integration/test_llama_server_*.py.

The server runs the tiny random GGUF of tests/helpers/gguf_model.py: it never stops before
`max_tokens`, so every count is known. The binary comes from tests/helpers/binaries.py
(a skip, a failure in CI, when there is none).
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slo.cli.bench.server import free_port, stop_process
from tests.conftest import require_or_skip
from tests.helpers.binaries import llama_server
from tests.helpers.gguf_model import write_tiny_llama
from tests.helpers.polling import wait_until_ready

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny-llama"
TABLE = "llm_slo_request_records"


def tiny_gguf(folder: Path) -> Path:
    """The tiny random GGUF, written into `folder`; skips (fails in CI) without `gguf`."""
    try:
        import gguf  # noqa: F401
    except ImportError as error:
        require_or_skip(f"gguf is not installed ({error}); pip install -e '.[thirdparty]'")
    return write_tiny_llama(folder / "tiny-llama.gguf", seed=0)


@contextlib.contextmanager
def child(command: list[str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield process
        finally:
            stop_process(process)


def ready(url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    try:
        wait_until_ready(url, timeout_s=120, process=process)
    except (RuntimeError, AssertionError) as error:
        raise AssertionError(f"{error}; its output:\n{log_path.read_text()}") from None


@contextlib.contextmanager
def real_llama_server(gguf: Path, scratch: Path, slots: int) -> Iterator[str]:
    """`llama-server --metrics` with `slots` parallel slots (512 tokens of context each, so a
    request beyond them is deferred); yields its base URL."""
    port = free_port()
    command = [llama_server(), "--model", str(gguf), "--alias", MODEL, "--metrics",
               "--host", "127.0.0.1", "--port", str(port), "--ctx-size", str(512 * slots),
               "--parallel", str(slots), "--threads", "1"]  # fmt: skip
    log_path = scratch / "llama-server.log"
    with child(command, log_path) as process:
        base_url = f"http://127.0.0.1:{port}"
        ready(base_url + "/health", process, log_path)  # 503 while the model loads
        yield base_url


@contextlib.contextmanager
def slo_proxy(
    upstream: str, db: Path, scratch: Path, *args: str
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`slo proxy` in front of `upstream` (more flags in `args`); yields (base URL, process).
    SIGTERM stops it with every record flushed."""
    port = free_port()
    command = [sys.executable, "-m", "slo.cli", "proxy", "--upstream", upstream,
               "--port", str(port), "--store", f"sqlite:///{db}", *args]  # fmt: skip
    log_path = scratch / "proxy.log"
    with child(command, log_path) as process:
        base_url = f"http://127.0.0.1:{port}"
        ready(base_url + "/metrics", process, log_path)
        yield base_url, process


@dataclass
class Proxied:
    base_url: str  # the proxy's
    process: subprocess.Popen[bytes]  # the proxy's
    upstream: str  # llama-server's base URL


@contextlib.contextmanager
def proxied(gguf: Path, scratch: Path, db: Path, slots: int, *proxy_args: str) -> Iterator[Proxied]:
    """llama-server and `slo proxy` (more flags in `proxy_args`) in front of it."""
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(real_llama_server(gguf, scratch, slots))
        base_url, process = stack.enter_context(slo_proxy(upstream, db, scratch, *proxy_args))
        yield Proxied(base_url, process, upstream)


def read_records(db: Path) -> list[dict[str, Any]]:
    with contextlib.closing(sqlite3.connect(db)) as connection:
        connection.row_factory = sqlite3.Row
        return [dict(row) for row in connection.execute(f"SELECT * FROM {TABLE} ORDER BY id")]


@dataclass
class Streamed:
    """One streamed request as the client saw it."""

    route: str
    max_tokens: int
    include_usage: bool
    text_events: int
    usage_tokens: int | None
    timings: list[dict[str, Any]]  # every `timings` object the stream carried, in order


def stream_once(client: Any, route: str, prompt: str, max_tokens: int, usage: bool) -> Streamed:
    """Stream one chat or completions request with the official `openai` client."""
    endpoint = client.chat.completions if route == "chat" else client.completions
    body: dict[str, Any] = {"prompt": prompt}
    if route == "chat":
        body = {"messages": [{"role": "user", "content": prompt}]}
    if usage:
        body["stream_options"] = {"include_usage": True}
    seen = Streamed(route, max_tokens, usage, 0, None, [])
    for chunk in endpoint.create(model=MODEL, max_tokens=max_tokens, stream=True, **body):
        # llama-server's extra key: the openai client keeps unknown fields in model_extra.
        if timings := (chunk.model_extra or {}).get("timings"):
            seen.timings.append(timings)
        if chunk.usage is not None:
            seen.usage_tokens = chunk.usage.completion_tokens
        choice = chunk.choices[0] if chunk.choices else None
        text = (choice.delta.content if route == "chat" else choice.text) if choice else None
        seen.text_events += 1 if text else 0
    return seen
