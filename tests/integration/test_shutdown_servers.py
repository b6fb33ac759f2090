"""Records survive shutdown under real servers: a burst of streamed requests, a signal while
they are in flight, and then the store holds one record per request that got a response.

Servers: uvicorn (SIGTERM, Ctrl-C, `--lifespan off`, an app without lifespan), gunicorn with
uvicorn workers (SIGTERM to the master) and hypercorn (SIGTERM to the master). uvicorn
re-raises SIGTERM with the default action after its drain, so nothing at exit would run: the
records must be in before that, by lifespan or, without it, by the middleware's signal hook.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from slo.cli.bench.server import free_port, stop_process
from tests.conftest import require_or_skip
from tests.helpers.servers import wait_until_ready

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BURST = 20


@dataclass
class Burst:
    answered: int = 0  # got a status line: the server took the request
    completed: int = 0  # the whole stream, `[DONE]` included
    refused: int = 0  # never reached the app (the server had stopped accepting)
    statuses: list[int] = field(default_factory=list)
    streaming_at_signal: int = 0  # answered and not finished when the signal went
    first_done: asyncio.Event = field(default_factory=asyncio.Event)


async def one_request(client: httpx.AsyncClient, burst: Burst, index: int) -> None:
    # Lengths spread over the burst: some streams end before the signal, others after it.
    body: dict[str, Any] = {"model": "sse-test", "stream": True, "max_tokens": 4 + 2 * index}
    body["messages"] = [{"role": "user", "content": "hi"}]
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            burst.answered += 1
            burst.statuses.append(response.status_code)
            lines = [line async for line in response.aiter_lines()]
            if response.status_code == 200 and "data: [DONE]" in lines:
                burst.completed += 1
                burst.first_done.set()
    except httpx.TransportError:
        burst.refused += 1


async def burst_then_signal(base_url: str, process: subprocess.Popen[str], signum: int) -> Burst:
    burst = Burst()
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        requests = [asyncio.create_task(one_request(client, burst, i)) for i in range(BURST)]
        await asyncio.wait_for(burst.first_done.wait(), timeout=60)
        burst.streaming_at_signal = burst.answered - burst.completed
        process.send_signal(signum)
        await asyncio.wait_for(asyncio.gather(*requests), timeout=120)
    return burst


def _default_sigint() -> None:
    # Ctrl-C as in a terminal: a suite run in the background starts with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def server(
    command: list[str], store_url: str, app_lifespan: bool
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = free_port()
    argv = [part.replace("{port}", str(port)) for part in command]
    process = subprocess.Popen(
        argv,
        cwd=ROOT,
        env={
            **os.environ,
            "LLM_SLO_TEST_STORE": store_url,
            "PYTHONPATH": str(ROOT),
            "LLM_SLO_TEST_LIFESPAN": "1" if app_lifespan else "0",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_default_sigint,
    )
    try:
        wait_until_ready(f"http://127.0.0.1:{port}/health", process=process)
        yield f"http://127.0.0.1:{port}", process
    finally:
        stop_process(process)
        if process.stdout is not None:
            process.stdout.close()


APP = "tests.helpers.shutdown_app:app"
UVICORN = [sys.executable, "-m", "uvicorn", APP, "--host", "127.0.0.1", "--port", "{port}",
           "--log-level", "warning"]  # fmt: skip
GUNICORN = [
    sys.executable, "-m", "gunicorn", APP, "--bind", "127.0.0.1:{port}",
    "--worker-class", "uvicorn.workers.UvicornWorker", "--workers", "2",
    "--graceful-timeout", "60", "--log-level", "warning",
]  # fmt: skip
HYPERCORN = [sys.executable, "-m", "hypercorn", APP, "--bind", "127.0.0.1:{port}",
             "--graceful-timeout", "60", "--log-level", "warning"]  # fmt: skip


@dataclass(frozen=True)
class Case:
    server: str  # the module that must be importable
    command: list[str]
    signum: int = signal.SIGTERM
    app_lifespan: bool = True  # False: the app raises on the lifespan scope


CASES = {
    "uvicorn-sigterm": Case("uvicorn", UVICORN),
    "uvicorn-ctrl-c": Case("uvicorn", UVICORN, signal.SIGINT),
    "uvicorn-lifespan-off": Case("uvicorn", [*UVICORN, "--lifespan", "off"]),
    "uvicorn-lifespan-off-ctrl-c": Case("uvicorn", [*UVICORN, "--lifespan", "off"], signal.SIGINT),
    "uvicorn-app-without-lifespan": Case("uvicorn", UVICORN, app_lifespan=False),
    "gunicorn-uvicorn-workers": Case("gunicorn", GUNICORN),
    "hypercorn": Case("hypercorn", HYPERCORN),
    "hypercorn-app-without-lifespan": Case("hypercorn", HYPERCORN, app_lifespan=False),
}


def require_server(name: str) -> None:
    modules = {"gunicorn": ["gunicorn", "uvicorn.workers"]}.get(name, [name])
    for module in modules:
        if importlib.util.find_spec(module) is None:
            require_or_skip(f"{module} is not installed (pip install -e '.[dev]')")


@pytest.mark.parametrize("case", list(CASES))
def test_records_equal_answered_requests_after_a_signal(case: str, tmp_path: Path) -> None:
    spec = CASES[case]
    require_server(spec.server)
    db = tmp_path / "records.db"
    with server(spec.command, f"sqlite:///{db}", spec.app_lifespan) as (base_url, process):
        burst = asyncio.run(burst_then_signal(base_url, process, spec.signum))
        process.wait(timeout=60)
        output = process.stdout.read() if process.stdout else ""

    # The signal came while requests were streaming, and the server drained them: every
    # request it took finished its stream.
    assert burst.streaming_at_signal > 0, output
    assert set(burst.statuses) == {200}, output
    assert burst.completed == burst.answered > 0, output
    assert burst.answered + burst.refused == BURST
    with sqlite3.connect(db) as connection:
        records = connection.execute(
            "SELECT outcome, count(*) FROM llm_slo_request_records GROUP BY outcome"
        ).fetchall()
    assert dict(records) == {"ok": burst.answered}, f"{case}: {records} for {burst}\n{output}"
    assert not list(tmp_path.glob("llm-slo-spool-*")), output
