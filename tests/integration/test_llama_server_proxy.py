"""llama.cpp's real C++ `llama-server --metrics` behind `slo proxy`.

The server runs the tiny random GGUF of tests/helpers/gguf_model.py (it never stops before
`max_tokens`). The official `openai` client streams through the proxy and reads the final
chunk's `timings` (the proxy passes the bytes through): every record must carry llama-server's
own prefill (`timings.prompt_ms`) and its count of generated tokens (`timings.predicted_n`).
"""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import pytest

from slo.sli import PHASES
from tests.helpers.llama_server_process import proxied, read_records, stream_once, tiny_gguf
from tests.helpers.polling import wait_until

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The record's prefill is the engine's prompt_ms, stored in seconds: equal within rounding.
PREFILL_TOLERANCE_MS = 2.0
EPSILON_S = 1e-6


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gguf(tmp_path_factory.mktemp("gguf"))


# (route, prompt, max_tokens, include_usage): prompts differ so that each one is prefilled.
REQUESTS = [
    ("chat", "Hello there", 1, False),
    ("chat", "What is a service level objective?", 7, False),
    ("chat", "Tell me where the time of a request goes, phase by phase.", 24, True),
    ("completions", "Once upon a time", 9, False),
    ("completions", "The quick brown fox jumps over the lazy dog", 16, True),
]


def test_streamed_records_carry_llama_servers_prefill_and_counts(
    gguf: Path, tmp_path: Path
) -> None:
    db = tmp_path / "records.db"
    with proxied(gguf, tmp_path, db, slots=1) as served:
        client = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key="unused", max_retries=0)
        seen = [stream_once(client, *request) for request in REQUESTS]
        client.close()
        served.process.send_signal(signal.SIGTERM)  # the proxy flushes every record as it stops
        served.process.wait(timeout=60)
    assert served.process.returncode == 0, (tmp_path / "proxy.log").read_text()
    records = read_records(db)
    assert len(records) == len(seen), records

    differences_ms = []
    for request, record in zip(seen, records, strict=True):
        where = f"{request}: {record}"
        assert request.timings, f"llama-server sent no timings through the proxy: {where}"
        timings = request.timings[-1]
        # The fixture's promise: the model never stops before max_tokens.
        assert timings["predicted_n"] == request.max_tokens, where
        assert record["outcome"] == "ok" and bool(record["stream"]), where
        assert record["output_tokens"] == timings["predicted_n"], where
        # The proxy asks for usage on the client's behalf (--inject-usage, the default): the
        # record counts from usage, and the client sees usage only where it would have unasked
        # (it asked, or a completions stream, which always carries it) and still gets timings.
        sent_usage = request.usage_tokens is not None
        assert sent_usage == (request.include_usage or request.route == "completions"), where
        assert record["tokens_source"] == "usage", where
        if sent_usage:
            assert request.usage_tokens == timings["predicted_n"], where
        assert record["prefill_s"] is not None, where
        difference_ms = record["prefill_s"] * 1000 - timings["prompt_ms"]
        differences_ms.append(difference_ms)
        assert abs(difference_ms) <= PREFILL_TOLERANCE_MS, where
        # Every SSE event with text is a token event: one ITL gap between each two.
        assert request.text_events == request.max_tokens, where
        assert len(json.loads(record["itl_s"] or "[]")) == request.text_events - 1, where
        # The engine's prefill is part of an additive breakdown of the client's wait.
        phases = sum(record.get(f"{phase}_s") or 0.0 for phase in PHASES)
        assert math.isclose(phases, record["e2e_s"], abs_tol=EPSILON_S), where
    print("record prefill - timings.prompt_ms (ms):", [f"{d:+.6f}" for d in differences_ms])


def test_a_cached_prompt_keeps_prefill_from_prompt_ms_and_counts_its_cached_tokens(
    gguf: Path, tmp_path: Path
) -> None:
    """The same stream twice: llama-server's prompt cache serves most of the second prompt
    (cache_n); the record takes prefill from prompt_ms (the part it did compute), counts the
    cached tokens, and the whole prompt as input."""
    db = tmp_path / "records.db"
    with proxied(gguf, tmp_path, db, slots=1) as served:
        client = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key="unused", max_retries=0)
        prompt = "Repeat after me: the same prompt, twice."
        seen = [stream_once(client, "chat", prompt, 5, False) for _ in range(2)]
        client.close()
        wait_until(lambda: len(read_records(db)) == 2, 30, "two records")
    records = read_records(db)
    first, second = (request.timings[-1] for request in seen)
    assert second["cache_n"] > 0, second  # the prompt was served from llama-server's cache
    assert second["prompt_n"] < first["prompt_n"], (first, second)
    for request, record in zip(seen, records, strict=True):
        timings = request.timings[-1]
        prompt_ms = timings["prompt_ms"]
        assert abs(record["prefill_s"] * 1000 - prompt_ms) <= PREFILL_TOLERANCE_MS, record
        assert record["output_tokens"] == timings["predicted_n"], record
        assert record["cached_tokens"] == timings["cache_n"], record
        assert record["input_tokens"] == timings["prompt_n"] + timings["cache_n"], record
