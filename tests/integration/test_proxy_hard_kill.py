"""A hard kill loses no record: `slo proxy` in front of an OpenAI-style upstream answers a load
of concurrent streamed chats (the official `openai` client), is SIGKILLed 50 ms after the last
answer arrived (as the OOM killer would: no handler runs, no flush), and is started again on
the same store and spool directory. After the second run every answered request is exactly
one record, found by the trace id its client sent: none lost, none twice. On SQLite and on
PostgreSQL.

Before the spool became the records' journal, the records of the last half second (the
writer's batch interval) and of the report delay were only in memory: a kill lost them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from slo.store import RecordStore
from tests.helpers.postgres import postgres_schema
from tests.helpers.proxy_process import slo_proxy_process
from tests.helpers.proxy_upstream import OpenAIUpstream
from tests.helpers.servers import uvicorn_thread

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.integration

REQUESTS = 200
CONCURRENCY = 16
TOKENS = 8
KILL_AFTER_S = 0.05  # after the last answer: the middleware reports 1 ms after each ends


@pytest.fixture(scope="module")
def upstream_url() -> Iterator[str]:
    with uvicorn_thread(OpenAIUpstream(itl_s=0.002)) as base_url:
        yield base_url


async def answer_all(base_url: str) -> list[str]:
    """Stream REQUESTS chats, CONCURRENCY at a time, each to its end; the trace ids sent
    (one per answered request: an answer that fails fails the test)."""
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
    expected = "".join(f" t{index}" for index in range(TOKENS))
    slots = asyncio.Semaphore(CONCURRENCY)

    async def one(index: int) -> str:
        trace_id = os.urandom(16).hex()
        headers = {
            "traceparent": f"00-{trace_id}-{os.urandom(8).hex()}-01",
            "x-llm-tier": ("premium", "standard", "batch")[index % 3],
        }
        async with slots:
            stream = await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=TOKENS,
                stream=True,
                extra_headers=headers,
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == expected
        return trace_id

    try:
        return await asyncio.gather(*(one(index) for index in range(REQUESTS)))
    finally:
        await client.close()


def stored_trace_ids(store_url: str, tmp_path: Path) -> Counter[str | None]:
    with RecordStore(store_url, spool_dir=tmp_path / "reader") as store:
        records = store.query()
    assert {record.outcome for record in records} <= {"ok"}
    return Counter(record.trace_id for record in records)


def kill_under_load_then_restart(upstream_url: str, store_url: str, tmp_path: Path) -> None:
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    env = {"TMPDIR": str(spool_dir)}  # where a PostgreSQL store's spool goes
    killed_log, restarted_log = tmp_path / "killed.log", tmp_path / "restarted.log"
    with slo_proxy_process(upstream_url, store_url, killed_log, env=env) as (base_url, proxy):
        answered = asyncio.run(answer_all(base_url))
        time.sleep(KILL_AFTER_S)
        proxy.send_signal(signal.SIGKILL)
        assert proxy.wait(timeout=30) == -signal.SIGKILL
    at_the_kill = sum(stored_trace_ids(store_url, tmp_path).values())
    with slo_proxy_process(upstream_url, store_url, restarted_log, env=env) as (_, restarted):
        pass  # its store replays what the killed one left; SIGTERM then flushes it
    output = killed_log.read_text() + restarted_log.read_text()
    assert restarted.returncode == 0, output
    stored = stored_trace_ids(store_url, tmp_path)
    missing = set(answered) - set(stored)
    twice = {trace_id: count for trace_id, count in stored.items() if count > 1}
    assert not missing and not twice, (
        f"{len(answered)} answered, {at_the_kill} stored at the kill; after the restart "
        f"{len(missing)} missing, {len(twice)} stored more than once\n{output}"
    )
    assert stored == Counter(answered)
    assert not list(spool_dir.glob("llm-slo-spool-*")), output  # replayed, and removed


def test_sqlite_store_keeps_every_answered_request_through_a_sigkill(
    upstream_url: str, tmp_path: Path
) -> None:
    store_url = f"sqlite:///{tmp_path / 'spool' / 'records.db'}"  # its spool sits beside it
    kill_under_load_then_restart(upstream_url, store_url, tmp_path)


def test_postgres_store_keeps_every_answered_request_through_a_sigkill(
    upstream_url: str, tmp_path: Path
) -> None:
    with postgres_schema("hard_kill") as store_url:
        kill_under_load_then_restart(upstream_url, store_url, tmp_path)
