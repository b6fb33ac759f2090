"""A real third-party engine: llama-cpp-python's FastAPI server, measured two ways.

1. `LatencyMiddleware` mounted on llama-cpp-python's own app, under a real `uvicorn`.
2. `slo proxy --upstream URL` in front of llama-cpp-python's uvicorn server.

The official `openai` client sends streamed and plain requests, chat and completions, to a
tiny random GGUF (tests/helpers/gguf_model.py: it never stops before `max_tokens`, one
token is one text chunk). Every record is checked against what the client saw: its token
count, its TTFT, its ITL gaps, its breakdown; and no record is lost to SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from slo.sli import PHASES
from tests.conftest import require_or_skip
from tests.helpers.gguf_model import write_tiny_llama
from tests.helpers.servers import free_port, stop_process, wait_until_ready

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny-llama"
MAX_TOKENS = (1, 7, 24)  # one token (no gap), a few, more than a handful
BURST = 20
# How long the probe between the engine and the measuring side holds back the first text
# (tests/helpers/llama_server.py): the chat role chunk then leaves well before any text.
FIRST_TEXT_DELAY_S = 0.05
EPSILON_S = 1e-6


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        import gguf  # noqa: F401
        import llama_cpp.server.app  # noqa: F401
    except ImportError as error:
        require_or_skip(
            f"llama-cpp-python[server] and gguf are not installed ({error}); "
            "install them with pip install -e '.[thirdparty]'"
        )
    return write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf", seed=0)


@dataclass
class Mounting:
    base_url: str
    db_path: Path
    probe_log: Path
    front: subprocess.Popen[bytes]  # the process that measures: uvicorn or `slo proxy`


@contextlib.contextmanager
def child(
    command: list[str], log_path: Path, env: dict[str, str]
) -> Iterator[subprocess.Popen[bytes]]:
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            yield process
        finally:
            stop_process(process)


def ready(base_url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    try:
        wait_until_ready(base_url + "/v1/models", timeout_s=120, process=process)
    except (RuntimeError, TimeoutError) as error:
        raise AssertionError(f"{error}; its output:\n{log_path.read_text()}") from None


@contextlib.contextmanager
def llama_server(
    gguf: Path, scratch: Path, store: str | None, end_delay_s: float
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """llama-cpp-python's app under `uvicorn`; with `store`, the middleware around it."""
    port = free_port()
    env = {
        "LLM_SLO_TEST_GGUF": str(gguf),
        "LLM_SLO_TEST_FIRST_TEXT_LOG": str(scratch / "first-text.jsonl"),
        "LLM_SLO_TEST_FIRST_TEXT_DELAY_S": str(FIRST_TEXT_DELAY_S),
        "LLM_SLO_TEST_END_DELAY_S": str(end_delay_s),
    }
    if store is not None:
        env["LLM_SLO_TEST_STORE"] = store
    command = [sys.executable, "-m", "uvicorn",
               "--factory", "tests.helpers.llama_server:create_app", "--host", "127.0.0.1",
               "--port", str(port), "--log-level", "warning"]  # fmt: skip
    log_path = scratch / f"uvicorn-{port}.log"
    with child(command, log_path, env) as process:
        base_url = f"http://127.0.0.1:{port}"
        ready(base_url, process, log_path)
        yield base_url, process


@contextlib.contextmanager
def mounted(kind: str, gguf: Path, scratch: Path, end_delay_s: float = 0.0) -> Iterator[Mounting]:
    db_path = scratch / "records.db"
    store = f"sqlite:///{db_path}"
    probe_log = scratch / "first-text.jsonl"
    if kind == "middleware":
        with llama_server(gguf, scratch, store, end_delay_s) as (base_url, process):
            yield Mounting(base_url, db_path, probe_log, process)
        return
    with llama_server(gguf, scratch, None, end_delay_s) as (upstream_url, _upstream):
        port = free_port()
        command = [sys.executable, "-m", "slo.cli", "proxy", "--upstream", upstream_url,
                   "--port", str(port), "--store", store]  # fmt: skip
        log_path = scratch / "proxy.log"
        with child(command, log_path, {}) as process:
            base_url = f"http://127.0.0.1:{port}"
            ready(base_url, process, log_path)
            yield Mounting(base_url, db_path, probe_log, process)


@pytest.fixture(scope="module", params=["middleware", "proxy"])
def mounting(
    request: pytest.FixtureRequest, tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Mounting]:
    with mounted(request.param, tiny_gguf, tmp_path_factory.mktemp(request.param)) as served:
        yield served


@dataclass
class Seen:
    """One request as the client saw it."""

    max_tokens: int
    text_events: int  # chunks (or bodies) that carried text
    usage_tokens: int | None  # usage.completion_tokens, where the reply had usage
    usage_prompt_tokens: int | None
    usage_chunks: int  # stream chunks that carried `usage`
    ttft_s: float  # first text (streams) or the whole body (plain)


def chunk_text(route: str, chunk: Any) -> str:
    if not chunk.choices:
        return ""
    if route == "chat":
        return chunk.choices[0].delta.content or ""
    return chunk.choices[0].text or ""


def ask(client: Any, route: str, max_tokens: int, stream: bool) -> Seen:
    endpoint = client.chat.completions if route == "chat" else client.completions
    prompt: dict[str, Any] = (
        {"messages": [{"role": "user", "content": "Hello there"}]}
        if route == "chat"
        else {"prompt": "Hello there"}
    )
    started = time.perf_counter()
    reply = endpoint.create(
        model=MODEL, max_tokens=max_tokens, temperature=0.7, seed=1, stream=stream, **prompt
    )
    if not stream:
        body_at = time.perf_counter() - started
        choice = reply.choices[0]
        text = choice.message.content if route == "chat" else choice.text
        usage = reply.usage
        return Seen(
            max_tokens,
            1 if text else 0,
            usage and usage.completion_tokens,
            usage and usage.prompt_tokens,
            0,
            body_at,
        )
    first_text: float | None = None
    text_events = usage_chunks = 0
    for chunk in reply:
        if chunk.usage is not None:
            usage_chunks += 1
        if chunk_text(route, chunk):
            text_events += 1
            if first_text is None:
                first_text = time.perf_counter()
    assert first_text is not None, "the stream carried no text"
    return Seen(max_tokens, text_events, None, None, usage_chunks, first_text - started)


def read_records(db_path: Path) -> list[dict[str, Any]]:
    if not db_path.exists():
        return []
    with contextlib.closing(sqlite3.connect(db_path)) as connection:
        connection.row_factory = sqlite3.Row
        try:
            rows = connection.execute(
                "SELECT * FROM llm_slo_request_records ORDER BY id"
            ).fetchall()
        except sqlite3.OperationalError:  # the table is not there yet
            return []
    records = [dict(row) for row in rows]
    for record in records:
        if isinstance(record.get("itl_s"), str):
            record["itl_s"] = json.loads(record["itl_s"])
    return records


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def wait_for(read: Any, count: int, what: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """The first `count` items `read()` returns, once there are that many (records are written
    by a background thread, the probe notes a request after its last byte)."""
    deadline = time.monotonic() + timeout_s
    while True:
        items = read()
        if len(items) >= count or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(items) == count, f"expected {count} {what}, found {len(items)}"
    return items


def phase_sum(record: dict[str, Any]) -> float:
    """Every additive phase of the catalog; the ones the record leaves None count 0."""
    return sum(record.get(f"{phase}_s") or 0.0 for phase in PHASES)


def openai_client(base_url: str) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
@pytest.mark.parametrize("route", ["chat", "completions"])
def test_every_record_matches_what_the_client_saw(
    mounting: Mounting, route: str, stream: bool
) -> None:
    records_before = len(read_records(mounting.db_path))
    probes_before = len(read_lines(mounting.probe_log))
    client = openai_client(mounting.base_url)
    seen = [ask(client, route, max_tokens, stream) for max_tokens in MAX_TOKENS]
    client.close()
    records = wait_for(
        lambda: read_records(mounting.db_path), records_before + len(seen), "records"
    )[records_before:]
    probes = wait_for(
        lambda: read_lines(mounting.probe_log), probes_before + len(seen), "probe notes"
    )[probes_before:]

    for request, record, probe in zip(seen, records, probes, strict=True):
        where = (
            f"{route} {'stream' if stream else 'plain'} max_tokens={request.max_tokens}: {record}"
        )
        # The fixture's own promise: the model never stops early, one token per text chunk.
        if stream:
            assert request.text_events == request.max_tokens, where
            # llama-cpp-python sends no usage in streams; a usage chunk the middleware asked
            # for on the client's behalf must never reach a client that did not ask.
            assert request.usage_chunks == 0, where
        else:
            assert request.usage_tokens == request.max_tokens, where
        assert record["outcome"] == "ok" and record["status_code"] == 200, where
        assert bool(record["stream"]) is stream, where

        # Token counts: exact from usage in plain replies, the text-chunk count in streams.
        if stream:
            assert record["output_tokens"] == request.text_events, where
            assert record["tokens_source"] == "chunks", where
        else:
            assert record["output_tokens"] == request.usage_tokens, where
            assert record["input_tokens"] == request.usage_prompt_tokens, where
            assert record["tokens_source"] == "usage", where

        # TTFT: at or after the first text left the engine, no later than the client saw it.
        assert record["ttft_s"] is not None, where
        assert probe["first_text_s"] is not None, where
        assert probe["first_text_s"] <= record["ttft_s"] <= request.ttft_s, (
            f"{where}: first text left the engine at {probe['first_text_s']:.6f} s, "
            f"client saw it at {request.ttft_s:.6f} s"
        )

        # ITL: one gap between each two token events (a plain reply is one event: no gap).
        gaps = len(record["itl_s"] or [])
        assert gaps == request.text_events - 1, where

        # The breakdown adds up to e2e.
        assert math.isclose(phase_sum(record), record["e2e_s"], abs_tol=EPSILON_S), where


async def burst(base_url: str) -> list[Seen]:
    """BURST requests at once (streamed and plain, chat and completions)."""
    import openai

    client = openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120
    )

    async def one(index: int) -> Seen:
        route = ("chat", "completions")[index % 2]
        stream = index % 4 < 2
        max_tokens = 4 + index
        endpoint: Any = client.chat.completions if route == "chat" else client.completions
        prompt: dict[str, Any] = (
            {"messages": [{"role": "user", "content": "Hi"}]}
            if route == "chat"
            else {"prompt": "Hi"}
        )
        reply = await endpoint.create(model=MODEL, max_tokens=max_tokens, stream=stream, **prompt)
        if not stream:
            return Seen(max_tokens, 1, reply.usage.completion_tokens, None, 0, 0.0)
        events = 0
        async for chunk in reply:
            events += 1 if chunk_text(route, chunk) else 0
        return Seen(max_tokens, events, None, None, 0, 0.0)

    try:
        return list(await asyncio.gather(*(one(i) for i in range(BURST))))
    finally:
        await client.close()


@pytest.mark.parametrize("kind", ["middleware", "proxy"])
def test_sigterm_right_after_a_burst_loses_no_record(
    kind: str, tiny_gguf: Path, tmp_path: Path
) -> None:
    with mounted(kind, tiny_gguf, tmp_path) as served:
        seen = asyncio.run(burst(served.base_url))
        served.front.send_signal(signal.SIGTERM)
        served.front.wait(timeout=60)
    records = read_records(served.db_path)
    logs = "\n".join(f"{log.name}:\n{log.read_text()}" for log in sorted(tmp_path.glob("*.log")))
    assert len(records) == BURST, logs
    assert all(record["outcome"] == "ok" for record in records)
    generated = sorted(request.usage_tokens or request.text_events for request in seen)
    assert sorted(record["output_tokens"] for record in records) == generated


@pytest.mark.parametrize("kind", ["middleware", "proxy"])
def test_a_client_that_leaves_after_done_got_everything_and_is_not_cancelled(
    kind: str, tiny_gguf: Path, tmp_path: Path
) -> None:
    """The official client closes the connection at `data: [DONE]`; here the server ends the
    response a little later (tests/helpers/llama_server.py), so the client is always gone
    first. It received every token and the end marker: the request was served, not
    cancelled, and its record must say so."""
    with mounted(kind, tiny_gguf, tmp_path, end_delay_s=0.2) as served:
        client = openai_client(served.base_url)
        seen = [ask(client, route, 5, True) for route in ("chat", "completions")]
        client.close()
        records = wait_for(lambda: read_records(served.db_path), len(seen), "records")
    for request, record in zip(seen, records, strict=True):
        assert request.text_events == request.max_tokens, record
        assert record["outcome"] == "ok", record
        assert record["output_tokens"] == request.text_events, record
