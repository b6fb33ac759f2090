"""The OpenAI-compatible API over real HTTP: the official client, validation, overload,
disconnects."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")
openai = pytest.importorskip("openai")

from engine import Engine, EngineConfig  # noqa: E402
from engine.api import create_app  # noqa: E402
from tests.helpers.servers import slo_serve, uvicorn_thread  # noqa: E402

MODEL = "bundled:tiny"


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    """`slo serve` itself, as a user starts it."""
    with slo_serve("--model", MODEL) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def small_server() -> Iterator[tuple[str, Engine]]:
    """An engine with a tiny queue and body limit, to reach the limits quickly."""
    # Steps slowed to 5 ms so a long request reliably holds the only slot while others queue.
    engine = Engine.from_pretrained(
        MODEL, EngineConfig(max_batch_size=1, max_waiting=1, step_delay_s=0.005)
    )
    with uvicorn_thread(create_app(engine, max_body_bytes=4096)) as base_url:
        yield base_url, engine


def client(base_url: str) -> Any:
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)


def test_openai_client_chat_and_completions(served: str) -> None:
    api = client(served)
    assert [m.id for m in api.models.list().data] == [MODEL]

    chat = api.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0
    )
    assert chat.choices[0].finish_reason in ("length", "stop")
    assert chat.usage is not None and chat.usage.completion_tokens >= 1
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens

    stream = api.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == chat.choices[0].message.content  # greedy: same text either way
    assert (
        chunks[-1].usage is not None
        and chunks[-1].usage.completion_tokens == chat.usage.completion_tokens
    )

    text = api.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0
    )
    assert text.choices[0].finish_reason in ("length", "stop")
    pieces = list(
        api.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0, stream=True
        )
    )
    assert "".join(p.choices[0].text for p in pieces) == text.choices[0].text


def test_openai_client_sees_typed_errors(served: str) -> None:
    api = client(served)
    with pytest.raises(openai.BadRequestError) as caught:
        api.completions.create(model=MODEL, prompt="x", max_tokens=100_000)
    assert "max_tokens" in caught.value.message
    with pytest.raises(openai.NotFoundError):
        api.completions.create(model="no-such-model", prompt="x", max_tokens=1)


BAD_REQUESTS = [
    ("/v1/completions", b"{not json", 400, "not valid JSON"),
    ("/v1/completions", b"[1, 2]", 400, "JSON object"),
    ("/v1/completions", b"", 400, "empty"),
    ("/v1/completions", {"prompt": "x"}, 400, "'model' is required"),
    ("/v1/completions", {"model": MODEL}, 400, "'prompt' is required"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "ten"}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 5000}, 400, "cap"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": 7}, 400, "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 3}, 400, "'n'"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": [""]}, 400, "stop"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"model": MODEL, "prompt": {"a": 1}}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": [1, 99999]}, 400, "token ids"),
    ("/v1/completions", {"model": MODEL, "prompt": "x" * 1500}, 400, "context"),
    ("/v1/completions", {"model": MODEL, "prompt": "x" * 1000, "max_tokens": 100}, 400, "context"),
    ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, 404, "does not exist"),
    ("/v1/chat/completions", {"model": MODEL}, 400, "'messages' is required"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": ["hi"]}, 400, "messages[0]"),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]},
        400,
        "role",
    ),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": 5}]},
        400,
        "content",
    ),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        "text",
    ),
]


@pytest.mark.parametrize(("path", "body", "status", "phrase"), BAD_REQUESTS)
def test_bad_requests_get_json_4xx(
    served: str, path: str, body: Any, status: int, phrase: str
) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(
        served + path, content=content, headers={"content-type": "application/json"}, timeout=30
    )
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert phrase in error["message"]
    assert error["type"]


TOO_LARGE = [
    ("/v1/completions", {"prompt": "x" * 1500}, "prompt"),
    ("/v1/completions", {"prompt": "x" * 1000, "max_tokens": 100}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 5000}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 1500}]}, "messages"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 5000},
        "max_tokens",
    ),
]


@pytest.mark.parametrize(("path", "body", "param"), TOO_LARGE)
def test_too_large_names_the_parameter(
    served: str, path: str, body: dict[str, Any], param: str
) -> None:
    """The engine's one size check names the field to change; a chat's prompt is `messages`."""
    response = httpx.post(served + path, json={"model": MODEL, **body}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert error["code"] == "context_length_exceeded"


def test_unknown_route_and_method(served: str) -> None:
    assert httpx.get(served + "/v2/nothing").json()["error"]["type"] == "not_found_error"
    response = httpx.get(served + "/v1/completions")
    assert response.status_code == 405 and "not allowed" in response.json()["error"]["message"]


def test_body_over_limit_is_413(small_server: tuple[str, Engine]) -> None:
    base_url, _ = small_server
    body = json.dumps({"model": MODEL, "prompt": "x" * 10_000}).encode()
    response = httpx.post(base_url + "/v1/completions", content=body)
    assert response.status_code == 413
    assert "limit" in response.json()["error"]["message"]


def test_overload_is_429_with_retry_after(small_server: tuple[str, Engine]) -> None:
    base_url, engine = small_server
    slow = {"model": MODEL, "prompt": "hold", "max_tokens": 600, "ignore_eos": True, "stream": True}
    with (
        httpx.Client(base_url=base_url, timeout=60) as http,
        http.stream("POST", "/v1/completions", json=slow) as running,
        ThreadPoolExecutor(1) as pool,
    ):
        lines = running.iter_lines()  # kept: a discarded iterator closes the stream
        next(lines)  # running: takes the only batch slot
        # A second one waits for the slot and fills the queue of one.
        waiting = pool.submit(
            httpx.post, base_url + "/v1/completions", json={**slow, "stream": False}, timeout=60
        )
        deadline = time.monotonic() + 10
        while httpx.get(base_url + "/health").json()["active_requests"] < 2:
            assert time.monotonic() < deadline, "the second request never queued"
            time.sleep(0.01)
        refused = http.post(
            "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1}
        )
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "overloaded"
        running.close()  # free the slot: the queued request is served
        assert waiting.result().status_code == 200
    wait_for_idle(base_url, engine)


def wait_for_idle(base_url: str, engine: Engine, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        health = httpx.get(base_url + "/health").json()
        if health["active_requests"] == 0 and health["kv_blocks_free"] == health["kv_blocks_total"]:
            return
        time.sleep(0.02)
    raise AssertionError(f"engine not idle: {httpx.get(base_url + '/health').json()}")


def test_disconnect_mid_stream_cancels_generation(small_server: tuple[str, Engine]) -> None:
    base_url, engine = small_server
    finished: list[str] = []
    hooks = type("H", (), {"on_finish": lambda self, rid, t, reason: finished.append(reason)})()
    engine.add_hooks(hooks)
    try:
        body = {
            "model": MODEL,
            "prompt": "go",
            "max_tokens": 900,
            "ignore_eos": True,
            "stream": True,
        }
        with (
            httpx.Client(base_url=base_url, timeout=30) as http,
            http.stream("POST", "/v1/completions", json=body) as response,
        ):
            lines = response.iter_lines()
            for _ in range(3):
                next(lines)
        wait_for_idle(base_url, engine)
        assert finished == ["cancelled"]
    finally:
        engine.remove_hooks(hooks)


def test_disconnect_while_waiting_for_non_streamed_answer(small_server: tuple[str, Engine]) -> None:
    base_url, engine = small_server
    body = {"model": MODEL, "prompt": "go", "max_tokens": 900, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(base_url + "/v1/completions", json=body, timeout=0.3)
    wait_for_idle(base_url, engine)


def test_health_reports_cold_start(served: str) -> None:
    health = httpx.get(served + "/health").json()
    assert health["status"] == "ok" and health["cold_start_s"] > 0


@pytest.fixture(scope="module")
def limited_server() -> Iterator[tuple[str, Engine]]:
    """One batch slot, 5 ms steps, and time limits short enough to hit on purpose."""
    from engine.api import Limits

    engine = Engine.from_pretrained(MODEL, EngineConfig(max_batch_size=1, step_delay_s=0.005))
    limits = Limits(first_token_timeout_s=0.3, request_timeout_s=3.0)
    with uvicorn_thread(create_app(engine, limits=limits)) as base_url:
        yield base_url, engine


def test_request_deadline_is_504_or_a_final_sse_error(limited_server: tuple[str, Engine]) -> None:
    base_url, engine = limited_server
    long = {"model": MODEL, "prompt": "x", "max_tokens": 900, "ignore_eos": True}
    response = httpx.post(base_url + "/v1/completions", json=long, timeout=30)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "deadline_exceeded"
    streamed = httpx.post(base_url + "/v1/completions", json={**long, "stream": True}, timeout=30)
    assert streamed.status_code == 200
    events = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert '"deadline_exceeded"' in events[-1] and "[DONE]" not in streamed.text
    wait_for_idle(base_url, engine)


def test_first_token_deadline_gives_up_queued_requests(limited_server: tuple[str, Engine]) -> None:
    base_url, engine = limited_server
    holder = {"model": MODEL, "prompt": "x", "max_tokens": 150, "ignore_eos": True}
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(httpx.post, base_url + "/v1/completions", json=holder, timeout=30)
        time.sleep(0.1)  # the first one holds the only slot for about 0.8 s
        queued = pool.submit(
            httpx.post, base_url + "/v1/completions", json={**holder, "max_tokens": 5}, timeout=30
        )
        assert first.result().status_code == 200
        refused = queued.result()
    assert refused.status_code == 504
    assert "first token within 0.3 s" in refused.json()["error"]["message"]
    wait_for_idle(base_url, engine)


def test_engine_fault_is_a_generic_500_and_the_engine_keeps_serving(
    limited_server: tuple[str, Engine],
) -> None:
    base_url, engine = limited_server

    def fail_marked(request_ids: list[str]) -> None:
        raise RuntimeError("secret internal detail: tensor shape mismatch in layer 3")

    engine.worker.step_faults = fail_marked
    try:
        response = httpx.post(
            base_url + "/v1/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 3},
            timeout=30,
        )
    finally:
        engine.worker.step_faults = None
    assert response.status_code == 500
    message = response.json()["error"]["message"]
    assert "secret" not in message and "RuntimeError" not in message and "request id" in message
    healthy = httpx.post(
        base_url + "/v1/completions",
        json={"model": MODEL, "prompt": "x", "max_tokens": 3},
        timeout=30,
    )
    assert healthy.status_code == 200
