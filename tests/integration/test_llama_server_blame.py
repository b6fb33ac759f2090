"""Estimated blame through `slo proxy` in front of llama.cpp's real C++ `llama-server`
(`--parallel 2`, docs/blame.md): under a batch flood beside a long premium stream, the
estimated interference on premium names batch for most of it; the records, the span-free
counter and the sums agree; premium alone names nobody else.

The server runs the tiny random GGUF of tests/helpers/gguf_model.py: every batch prompt is
prefilled in the server's step beside premium's decode, which stretches premium's gap.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.llama_server_process import MODEL, proxied, read_records, tiny_gguf

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BATCH_PROMPT = "Summarise the ledger line by line and keep every figure. " * 4  # ~400 tokens
PREMIUM_TOKENS = 300
BATCH_REQUESTS = 12
MOST = 0.5  # "most of it": more than half of premium's estimated interference names batch


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gguf(tmp_path_factory.mktemp("gguf"))


def stream(base_url: str, tier: str, prompt: str, max_tokens: int) -> int:
    """One streamed chat as `tier`; the number of text events it carried."""
    body = {"model": MODEL, "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
    events = 0
    with (
        httpx.Client(timeout=120) as client,
        client.stream(
            "POST", f"{base_url}/v1/chat/completions", json=body, headers={"x-llm-tier": tier}
        ) as response,
    ):
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: {") and '"content":"' in line:
                events += 1
    return events


def flood(base_url: str) -> None:
    """A long premium stream; batch prompts arrive one after another while it decodes."""
    started = threading.Event()

    def premium() -> int:
        started.set()
        return stream(base_url, "premium", "Hello", PREMIUM_TOKENS)

    with ThreadPoolExecutor(max_workers=4) as pool:
        long_stream = pool.submit(premium)
        started.wait()
        time.sleep(0.05)
        batch = []
        for index in range(BATCH_REQUESTS):
            batch.append(pool.submit(stream, base_url, "batch", f"{index} {BATCH_PROMPT}", 4))
            time.sleep(0.02)
        assert long_stream.result() > 0
        assert all(future.result() > 0 for future in batch)


def delay_caused(metrics_text: str) -> dict[tuple[str, str, str, str], float]:
    pattern = re.compile(r"^llm_slo_delay_caused_seconds_total\{([^}]*)\} (\S+)$", re.M)
    seen = {}
    for labels, value in pattern.findall(metrics_text):
        parts = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        key = (parts["tier"], parts["culprit_tier"], parts["cause"], parts["estimated"])
        seen[key] = float(value)
    return seen


def run(gguf: Path, scratch: Path, load: Any) -> tuple[list[dict[str, Any]], dict]:
    db = scratch / "records.db"
    with proxied(gguf, scratch, db, 2) as served:
        load(served.base_url)
        time.sleep(0.3)  # the last report
        counters = delay_caused(httpx.get(f"{served.base_url}/metrics").text)
        served.process.send_signal(signal.SIGTERM)
        served.process.wait(timeout=60)
    assert served.process.returncode == 0, (scratch / "proxy.log").read_text()
    records = read_records(db)
    for record in records:
        record["delay_blame"] = json.loads(record["delay_blame"] or "null")
    return records, counters


def interference(blame: dict[str, Any]) -> dict[str, float]:
    shares: dict[str, float] = {}
    for entry in blame["by_tier"]:
        if entry["cause"] == "interference":
            shares[entry["tier"]] = shares.get(entry["tier"], 0.0) + entry["s"]
    return shares


def test_a_batch_flood_beside_premium_names_batch_for_most_of_premiums_interference(
    gguf: Path, tmp_path: Path
) -> None:
    records, counters = run(gguf, tmp_path, flood)
    assert len(records) == 1 + BATCH_REQUESTS
    for record in records:
        blame = record["delay_blame"]
        assert blame is not None and blame["estimated"] is True, record
        # The sums: queue blame is the wait it split, interference plus decode-only the decode.
        queue = sum(e["s"] for e in blame["by_tier"] if e["cause"] == "queue")
        assert queue == pytest.approx(blame["queue_s"], abs=1e-6), blame
        assert sum(interference(blame).values()) == pytest.approx(blame["interference_s"], abs=1e-6)
        assert blame["decode_only_s"] + blame["interference_s"] == pytest.approx(
            blame["decode_s"], abs=1e-6
        )
    (premium,) = [r for r in records if r["tier"] == "premium"]
    shares = interference(premium["delay_blame"])
    total = sum(shares.values())
    assert total > 0, premium["delay_blame"]
    assert shares.get("batch", 0.0) / total > MOST, premium["delay_blame"]
    # The counter counts what the records name, under estimated="true"; nothing exact.
    for tier in ("premium", "batch"):
        for cause in ("queue", "interference"):
            for culprit in ("premium", "batch"):
                named = sum(
                    e["s"]
                    for r in records
                    if r["tier"] == tier
                    for e in r["delay_blame"]["by_tier"]
                    if e["cause"] == cause and e["tier"] == culprit
                )
                key = (tier, culprit, cause, "true")
                assert counters[key] == pytest.approx(named, rel=1e-6, abs=1e-9), key
    assert all(value == 0 for key, value in counters.items() if key[3] == "false")


def test_premium_alone_names_nobody_else(gguf: Path, tmp_path: Path) -> None:
    def alone(base_url: str) -> None:
        for prompt in ("Hello", "What is an SLO?", "Tell me more"):
            assert stream(base_url, "premium", prompt, 64) > 0

    records, _ = run(gguf, tmp_path, alone)
    assert len(records) == 3
    for record in records:
        blame = record["delay_blame"]
        assert blame["interference_s"] == 0.0, blame
        assert {e["tier"] for e in blame["by_tier"]} <= {"none"}, blame
