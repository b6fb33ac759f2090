"""The OpenAI request fields over real HTTP with the official client: each refused field is a
400 naming it (`param`), each ignored one is served, and the honoured sampling fields change
the text as docs/openai-fields.md says."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")
openai = pytest.importorskip("openai")

from engine import Engine, EngineConfig  # noqa: E402
from engine.api import create_app  # noqa: E402
from tests.helpers.openai_fields import ACCEPTED, MORE_REFUSED, REFUSED, body  # noqa: E402
from tests.helpers.servers import uvicorn_thread  # noqa: E402

pytestmark = pytest.mark.integration

MODEL = "bundled:tiny"
CHAT = [{"role": "user", "content": "Once upon a time"}]


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    engine = Engine.from_pretrained(MODEL, EngineConfig(max_model_len=256))
    with uvicorn_thread(create_app(engine)) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url: str) -> Any:
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)


def _create(client: Any, route: str, extra: dict[str, Any], **kwargs: Any) -> Any:
    """One request through the official client; `extra` goes into the body as given."""
    if route == "chat":
        return client.chat.completions.create(
            model=MODEL, messages=CHAT, extra_body=extra, **kwargs
        )
    return client.completions.create(
        model=MODEL, prompt="Once upon a time", extra_body=extra, **kwargs
    )


def _text(reply: Any) -> str:
    choice = reply.choices[0]
    return str(choice.message.content if hasattr(choice, "message") else choice.text)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_field_is_a_400_naming_it(client: Any, name: str) -> None:
    route, value = REFUSED[name]
    with pytest.raises(openai.BadRequestError) as caught:
        _create(client, route, {name: value}, max_tokens=2)
    assert caught.value.status_code == 400
    assert caught.value.param == name
    assert f"'{name}'" in caught.value.message and "remove it" in caught.value.message


@pytest.mark.parametrize(("name", "route", "value"), MORE_REFUSED)
def test_other_refused_shapes_name_the_field(
    client: Any, name: str, route: str, value: Any
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        _create(client, route, {name: value}, max_tokens=2)
    assert caught.value.param == name


def test_refusal_is_said_for_streams_too(base_url: str) -> None:
    request = body("chat", {"stream": True, "tools": REFUSED["tools"][1]}, MODEL)
    response = httpx.post(base_url + "/v1/chat/completions", json=request, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "tools"
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(("name", "route", "value"), ACCEPTED)
def test_ignored_and_plain_values_are_served(
    base_url: str, name: str, route: str, value: Any
) -> None:
    path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
    response = httpx.post(base_url + path, json=body(route, {name: value}, MODEL), timeout=60)
    assert response.status_code == 200, response.text


def test_unknown_field_is_named(base_url: str) -> None:
    request = body("chat", {"guided_json": {"type": "object"}}, MODEL)
    response = httpx.post(base_url + "/v1/chat/completions", json=request, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "guided_json"


def test_logit_bias_forces_and_bans(client: Any) -> None:
    # byte-level vocabulary: token 97 is "a", 98 is "b"
    for temperature in (0.0, 1.0):
        forced = _create(client, "completions", {"logit_bias": {"97": 100}, "ignore_eos": True},
                         max_tokens=6, temperature=temperature, seed=3)  # fmt: skip
        assert _text(forced) == "aaaaaa"
    banned = _create(client, "chat", {"logit_bias": {"97": -100, "98": 60},
                     "ignore_eos": True}, max_tokens=6, temperature=0)  # fmt: skip
    assert _text(banned) == "bbbbbb"


def test_logit_bias_outside_the_vocabulary_is_named(client: Any) -> None:
    for bias in ({"99999": 1}, {"a": 1}, {"5": 101}, ["5"]):
        with pytest.raises(openai.BadRequestError) as caught:
            _create(client, "chat", {"logit_bias": bias}, max_tokens=2)
        assert caught.value.param == "logit_bias"


def test_penalties_change_greedy_text(client: Any) -> None:
    def run(**penalties: float) -> str:
        reply = _create(client, "chat", {"ignore_eos": True}, max_tokens=24, temperature=0,
                        **penalties)  # fmt: skip
        return _text(reply)

    plain = run()
    assert run() == plain
    assert run(frequency_penalty=2.0) != plain
    assert run(presence_penalty=2.0) != plain
    for name in ("frequency_penalty", "presence_penalty"):
        with pytest.raises(openai.BadRequestError) as caught:
            _create(client, "chat", {name: 2.5}, max_tokens=2)
        assert caught.value.param == name


def test_seed_gives_the_same_text(client: Any) -> None:
    def run(seed: int) -> str:
        reply = _create(client, "chat", {"ignore_eos": True}, max_tokens=24, temperature=1.0,
                        seed=seed)  # fmt: skip
        return _text(reply)

    assert run(21) == run(21)
    assert run(21) != run(22)


def test_stop_ends_the_text_before_it(client: Any) -> None:
    forced = {"logit_bias": {"97": 100}, "ignore_eos": True}
    stopped = _create(client, "completions", forced, max_tokens=8, temperature=0, stop=["aaa"])
    assert _text(stopped) == "" and stopped.choices[0].finish_reason == "stop"
    ran = _create(client, "completions", forced, max_tokens=8, temperature=0, stop=["b", "ab"])
    assert _text(ran) == "a" * 8 and ran.choices[0].finish_reason == "length"
