"""Soak: 64 concurrent streaming clients for 60 s against `slo serve`, the example spec's tiers
mixed, some clients walking away mid-stream. Nothing may leak or go missing: every request is
recorded under the outcome the client saw, no 5xx, KV blocks all free afterwards, RSS bounded,
no record or span dropped."""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

pytest.importorskip("torch")

from slo.sli import CATALOG
from slo.spec import SLOSpec
from tests.helpers.servers import slo_serve_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLIENTS = 64
SOAK_S = float(os.environ.get("LLM_SLO_SOAK_S", "60"))
CUT_SHARE = 0.1  # clients that disconnect after a few chunks
RSS_GROWTH_LIMIT_MB = 150
TIER_WEIGHTS = {"premium": 0.2, "standard": 0.7, "batch": 0.1}
WORDS = (
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "owls",
)  # fmt: skip


@dataclass
class Tally:
    sent: int = 0
    completed: int = 0  # 200 and the whole stream, `[DONE]` included
    cut: int = 0  # we closed the connection mid-stream
    truncated: int = 0  # 200 but the stream ended early: must stay 0
    statuses: Counter[int] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)


async def one_request(client: httpx.AsyncClient, rng: random.Random, tally: Tally) -> None:
    tier = rng.choices(list(TIER_WEIGHTS), weights=list(TIER_WEIGHTS.values()))[0]
    cut = rng.random() < CUT_SHARE
    body = {
        "model": "bundled:tiny",
        "prompt": " ".join(rng.choices(WORDS, k=rng.randint(2, 24))),
        "max_tokens": 200 if cut else rng.randint(4, 48),
        "stream": True,
    }
    tally.sent += 1
    try:
        async with client.stream(
            "POST", "/v1/completions", json=body, headers={"x-llm-tier": tier}
        ) as response:
            tally.statuses[response.status_code] += 1
            if response.status_code != 200:
                await response.aread()
                return
            if cut:
                chunks = 0
                async for _ in response.aiter_lines():
                    chunks += 1
                    if chunks >= 3:
                        break  # leaving the block closes the connection with the body unread
                tally.cut += 1
                return
            lines = [line async for line in response.aiter_lines()]
            if "data: [DONE]" in lines:
                tally.completed += 1
            else:
                tally.truncated += 1
    except httpx.HTTPError as error:
        tally.errors.append(repr(error))


async def client_loop(base_url: str, index: int, until: float, tally: Tally) -> None:
    rng = random.Random(index)
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        while time.monotonic() < until:
            await one_request(client, rng, tally)


async def run_clients(base_url: str, seconds: float, tally: Tally) -> None:
    until = time.monotonic() + seconds
    await asyncio.gather(*(client_loop(base_url, i, until, tally) for i in range(CLIENTS)))


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert match, status
    return int(match[1]) / 1024


def metric_value(text: str, sli: str) -> float:
    name = CATALOG[sli].metric
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)]
    assert values, f"{name} is not exported"
    return sum(values)


def settled_health(base_url: str) -> dict[str, int]:
    """/health once the engine has nothing left to do (bounded wait)."""
    deadline = time.monotonic() + 30
    while True:
        health = httpx.get(base_url + "/health", timeout=10).json()
        idle = health["active_requests"] == 0
        if (idle and health["kv_blocks_free"] == health["kv_blocks_total"]) or (
            time.monotonic() > deadline
        ):
            return health
        time.sleep(0.2)


def test_soak_loses_nothing_and_leaks_nothing(tmp_path: Path) -> None:
    assert set(TIER_WEIGHTS) == {tier.name for tier in SLOSpec.default().tiers}
    db = tmp_path / "records.db"
    warmup, tally = Tally(), Tally()
    with slo_serve_process("--store", f"sqlite:///{db}", "--max-waiting", "1024") as (
        base_url,
        process,
    ):
        asyncio.run(run_clients(base_url, 3, warmup))  # batch shapes and allocator warm
        rss_start = rss_mb(process.pid)
        asyncio.run(run_clients(base_url, SOAK_S, tally))
        rss_end = rss_mb(process.pid)
        health = settled_health(base_url)
        metrics = httpx.get(base_url + "/metrics", timeout=10).text
        process.send_signal(signal.SIGTERM)  # drains and flushes every record (see test_sigterm)
        exit_code = process.wait(timeout=60)
        output = process.stdout.read() if process.stdout else ""

    assert exit_code == 0, output
    assert tally.errors == [] and tally.truncated == 0
    assert all(status < 500 for status in tally.statuses), tally.statuses
    assert set(tally.statuses) <= {200, 429}, tally.statuses
    assert health["active_requests"] == 0, health
    assert health["kv_blocks_free"] == health["kv_blocks_total"], health
    assert metric_value(metrics, "records_dropped") == 0
    assert metric_value(metrics, "spans_dropped") == 0
    growth = rss_end - rss_start
    assert growth < RSS_GROWTH_LIMIT_MB, f"RSS {rss_start:.0f} -> {rss_end:.0f} MB"

    with sqlite3.connect(db) as connection:
        outcomes = Counter(
            dict(
                connection.execute(
                    "SELECT outcome, count(*) FROM llm_slo_request_records GROUP BY outcome"
                ).fetchall()
            )
        )
    summary = (
        f"sent {warmup.sent}+{tally.sent}, completed {tally.completed}, cut {tally.cut}, "
        f"statuses {dict(tally.statuses)}, outcomes {dict(outcomes)}, "
        f"RSS {rss_start:.0f} -> {rss_end:.0f} MB"
    )
    print(summary)
    assert outcomes.total() == warmup.sent + tally.sent, summary  # records == requests sent
    assert set(outcomes) <= {"ok", "cancelled", "shed"}, summary
    everyone = Tally(
        completed=warmup.completed + tally.completed,
        cut=warmup.cut + tally.cut,
        statuses=warmup.statuses + tally.statuses,
    )
    assert outcomes["shed"] == everyone.statuses[429], summary
    # A cut stream whose last byte was already sent is ok, not cancelled; the rest add up.
    assert outcomes["ok"] + outcomes["cancelled"] == everyone.completed + everyone.cut, summary
    assert outcomes["ok"] >= everyone.completed, summary
    assert outcomes["cancelled"] > 0, summary  # disconnects are seen, not recorded as ok
