"""`slo proxy` as a real process in front of a real OpenAI-style upstream (uvicorn on 127.0.0.1),
driven by the official `openai` client: answers pass through unchanged, every request becomes
one record, a dead or silent upstream gets an OpenAI-style 502/504, and a client that walks
away closes the upstream's stream."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from slo.cli.bench.server import free_port
from tests.helpers.proxy_process import slo_proxy
from tests.helpers.proxy_upstream import OpenAIUpstream
from tests.helpers.record_rows import records
from tests.helpers.servers import uvicorn_thread

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.integration


@pytest.fixture
def upstream() -> Iterator[tuple[OpenAIUpstream, str]]:
    app = OpenAIUpstream()
    with uvicorn_thread(app) as base_url:
        yield app, base_url


def test_openai_client_through_the_proxy(
    upstream: tuple[OpenAIUpstream, str], tmp_path: Path
) -> None:
    app, upstream_url = upstream
    db = tmp_path / "records.db"
    expected = "".join(f" t{index}" for index in range(5))
    with slo_proxy(upstream_url, db) as base_url:
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
        chat = [{"role": "user", "content": "hi"}]
        stream = client.chat.completions.create(model="m", messages=chat, max_tokens=5, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream) == expected
        reply = client.chat.completions.create(model="m", messages=chat, max_tokens=5)
        assert reply.choices[0].message.content == expected
        assert reply.usage is not None and reply.usage.completion_tokens == 5
        stream = client.completions.create(model="m", prompt="hi", max_tokens=5, stream=True)
        assert "".join(c.choices[0].text for c in stream) == expected
        assert (
            client.completions.create(model="m", prompt="hi", max_tokens=5).choices[0].text
            == expected
        )
        # What the upstream saw: its own Host, the client's address, the query string.
        response = httpx.post(
            base_url + "/v1/completions?echo=1",
            json={"prompt": "hi", "max_tokens": 2},
            headers={"x-llm-tier": "premium", "connection": "keep-alive"},
        )
        assert response.status_code == 200
        assert app.last_path == "/v1/completions?echo=1"
        assert app.last_headers["host"] == upstream_url.removeprefix("http://")
        assert app.last_headers["x-forwarded-for"] == "127.0.0.1"
        assert app.last_headers["x-llm-tier"] == "premium"
        assert "connection" not in app.last_headers  # hop-by-hop: not forwarded
        assert app.completed == 5
    rows = records(db)
    assert len(rows) == 5  # one per request, flushed on SIGTERM
    assert [row["outcome"] for row in rows] == ["ok"] * 5
    assert [row["route"] for row in rows] == ["/v1/chat/completions"] * 2 + ["/v1/completions"] * 3
    assert {row["model"] for row in rows} == {"test-upstream"}
    assert rows[-1]["tier"] == "premium"


def test_counts_are_exact_by_default_and_the_client_sees_no_usage(
    upstream: tuple[OpenAIUpstream, str], tmp_path: Path
) -> None:
    _, upstream_url = upstream
    db = tmp_path / "records.db"
    chat = [{"role": "user", "content": "hi"}]
    with slo_proxy(upstream_url, db) as base_url:  # usage is asked for by default
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
        chunks = list(
            client.chat.completions.create(model="m", messages=chat, max_tokens=7, stream=True)
        )
        assert all(chunk.choices for chunk in chunks)  # no usage-only chunk reached the client
        assert all(chunk.usage is None for chunk in chunks)
        asked = client.chat.completions.create(
            model="m", messages=chat, max_tokens=3, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        last = list(asked)[-1]
        assert last.usage is not None and last.usage.completion_tokens == 3
    rows = records(db)
    assert [(row["output_tokens"], row["tokens_source"]) for row in rows] == [
        (7, "usage"),
        (3, "usage"),
    ]
    for row in rows:
        assert row["queue_prefill_s"] is not None and row["other_s"] is not None
        parts = ("network_s", "queue_prefill_s", "decode_s", "detokenize_s", "other_s")
        assert sum(row[part] or 0.0 for part in parts) == pytest.approx(row["e2e_s"], abs=1e-6)


def test_no_inject_usage_leaves_the_request_as_sent_and_counts_chunks(
    upstream: tuple[OpenAIUpstream, str], tmp_path: Path
) -> None:
    app, upstream_url = upstream
    db = tmp_path / "records.db"
    with slo_proxy(upstream_url, db, "--no-inject-usage") as base_url:
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
        stream = client.completions.create(model="m", prompt="hi", max_tokens=4, stream=True)
        assert len([chunk for chunk in stream if chunk.choices[0].text]) == 4
        assert "stream_options" not in app.last_request
    assert [(row["output_tokens"], row["tokens_source"]) for row in records(db)] == [(4, "chunks")]


def test_upstream_down_is_a_502_recorded_as_server_error(tmp_path: Path) -> None:
    dead_url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    db = tmp_path / "records.db"
    with slo_proxy(dead_url, db) as base_url:
        response = httpx.post(base_url + "/v1/completions", json={"prompt": "hi"})
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.InternalServerError) as raised:
            client.completions.create(model="m", prompt="hi", max_tokens=5, stream=True)
    assert response.status_code == 502
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    # What went wrong and the fix, but not where the upstream is (nor the socket's words).
    assert "cannot be reached" in error["message"] and "--upstream" in error["message"]
    assert dead_url.split("//")[1] not in response.text and "Errno" not in response.text
    assert error["code"] == "upstream_unreachable" and error["param"] is None
    assert raised.value.status_code == 502
    assert [row["outcome"] for row in records(db)] == ["server_error"] * 2
    assert [row["status_code"] for row in records(db)] == [502] * 2


def test_silent_upstream_is_a_504_recorded_as_timeout(
    upstream: tuple[OpenAIUpstream, str], tmp_path: Path
) -> None:
    _, upstream_url = upstream
    db = tmp_path / "records.db"
    with slo_proxy(upstream_url, db, "--read-timeout", "0.5") as base_url:
        started = time.monotonic()
        response = httpx.post(
            base_url + "/v1/chat/completions",
            json={"messages": [], "max_tokens": 2, "stream": True},
            headers={"x-test-delay-s": "3"},
            timeout=10,
        )
        waited_s = time.monotonic() - started
    assert response.status_code == 504
    assert waited_s < 2.5  # the proxy gave up, not the upstream finishing
    error = response.json()["error"]
    assert error["code"] == "upstream_timeout" and "--read-timeout" in error["message"]
    assert [row["outcome"] for row in records(db)] == ["timeout"]


def test_client_that_walks_away_closes_the_upstream_stream(
    upstream: tuple[OpenAIUpstream, str], tmp_path: Path
) -> None:
    app, upstream_url = upstream
    db = tmp_path / "records.db"
    with slo_proxy(upstream_url, db) as base_url:
        body = {"messages": [], "max_tokens": 400, "stream": True}
        with (
            httpx.Client(timeout=10) as client,
            client.stream(
                "POST",
                base_url + "/v1/chat/completions",
                json=body,
                headers={"x-test-itl-s": "0.02"},
            ) as response,
        ):
            lines = response.iter_lines()
            assert json.loads(next(line for line in lines if line)[6:])["choices"]
        # The client closed its connection mid-stream; the upstream notices within a few ITLs.
        deadline = time.monotonic() + 5
        while app.disconnects == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert app.disconnects == 1
        assert app.completed == 0
    assert [row["outcome"] for row in records(db)] == ["cancelled"]


@pytest.mark.parametrize("per_write", [1, 3, 40])
def test_each_sse_event_is_a_token_event_however_the_upstream_writes(
    upstream: tuple[OpenAIUpstream, str], tmp_path: Path, per_write: int
) -> None:
    """N content events give N-1 ITL gaps whether the upstream writes one event per write,
    three, or the whole stream at once (events read together are 0 s apart)."""
    _app, upstream_url = upstream
    db = tmp_path / "records.db"
    tokens = 12
    with slo_proxy(upstream_url, db) as base_url:
        response = httpx.post(
            base_url + "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": tokens,
                "stream": True,
            },
            headers={"x-test-events-per-write": str(per_write), "x-test-itl-s": "0.002"},
        )
        content_events = [line for line in response.text.split("\n\n") if '"content": " t' in line]
        assert len(content_events) == tokens
    (row,) = records(db)
    gaps = json.loads(str(row["itl_s"]))
    assert len(gaps) == tokens - 1
    assert row["output_tokens"] == tokens
    if per_write >= tokens + 2:  # role, every content event and the finish in one write
        assert gaps == [0.0] * (tokens - 1)
