"""SIGTERM during streaming load: in-flight requests finish, every answered request is recorded,
and `slo serve` exits 0."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from pathlib import Path

import httpx
import pytest

pytest.importorskip("torch")

from tests.helpers.servers import slo_serve_process

pytestmark = pytest.mark.integration

CLIENTS = 12
BODY = {"model": "bundled:tiny", "prompt": "Once upon a time", "max_tokens": 48, "stream": True}


class Load:
    def __init__(self) -> None:
        self.completed = 0  # 200 with the whole stream, `[DONE]` included
        self.answered = 0  # got a status line (the server has seen the request)
        self.statuses: list[int] = []
        self.in_flight = 0
        self.refused = 0


async def stream_until_refused(base_url: str, load: Load, client_index: int) -> None:
    tier = ("premium", "standard", "batch")[client_index % 3]
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        while True:
            load.in_flight += 1
            try:
                async with client.stream(
                    "POST", "/v1/completions", json=BODY, headers={"x-llm-tier": tier}
                ) as response:
                    load.answered += 1
                    load.statuses.append(response.status_code)
                    lines = [line async for line in response.aiter_lines()]
                    if response.status_code == 200 and "data: [DONE]" in lines:
                        load.completed += 1
            except httpx.TransportError:
                load.refused += 1  # the server stopped accepting: this client is done
                return
            finally:
                load.in_flight -= 1


async def run_and_terminate(base_url: str, process: object) -> Load:
    load = Load()
    clients = [asyncio.create_task(stream_until_refused(base_url, load, i)) for i in range(CLIENTS)]
    while load.completed < 2 * CLIENTS:  # under load, with streams in flight
        await asyncio.sleep(0.05)
    process.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
    await asyncio.wait_for(asyncio.gather(*clients), timeout=120)
    return load


def test_sigterm_drains_in_flight_requests_and_loses_no_record(tmp_path: Path) -> None:
    db = tmp_path / "records.db"
    with slo_serve_process("--store", f"sqlite:///{db}", "--max-waiting", "1024") as (
        base_url,
        process,
    ):
        load = asyncio.run(run_and_terminate(base_url, process))
        exit_code = process.wait(timeout=60)
        output = process.stdout.read() if process.stdout else ""

    assert exit_code == 0, output
    assert load.refused == CLIENTS  # every client ended by a refused connection, none by a hang
    # Every request the server answered finished its stream: drained, not cut.
    assert set(load.statuses) == {200} and load.completed == load.answered
    with sqlite3.connect(db) as connection:
        outcomes = dict(
            connection.execute(
                "SELECT outcome, count(*) FROM llm_slo_request_records GROUP BY outcome"
            ).fetchall()
        )
    assert outcomes == {"ok": load.completed}, output
    assert not list(tmp_path.glob("llm-slo-spool-*"))
