"""The OpenAI field registry (engine/api/fields.py) against the `openai` package's own request
types, the OpenAPI document and docs/openai-fields.md, so that none of them drifts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.api.fields import BY_ROUTE, FIELDS, markdown_table, refusal
from engine.api.openapi import openapi_document
from tests.helpers.openai_fields import ACCEPTED, MORE_REFUSED, REFUSED, body

DOC = Path(__file__).resolve().parents[3] / "docs" / "openai-fields.md"
START, END = "<!-- fields:start -->", "<!-- fields:end -->"


def _openai_fields(route: str) -> set[str]:
    """Every request field the official client sends, from its TypedDicts."""
    from openai.types import completion_create_params
    from openai.types.chat import completion_create_params as chat_create_params

    params = chat_create_params if route == "chat" else completion_create_params
    typed: Any = params.CompletionCreateParamsStreaming
    return set(typed.__required_keys__ | typed.__optional_keys__)


def test_the_docs_table_is_the_registry() -> None:
    text = DOC.read_text()
    assert START in text and END in text, f"{DOC}: the table's markers are missing"
    table = text.split(START, 1)[1].split(END, 1)[0].strip() + "\n"
    assert table == markdown_table(), (
        f"{DOC} is out of date; replace its table with `python -m engine.api.fields`"
    )


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_every_openai_field_has_a_disposition(route: str) -> None:
    pytest.importorskip("openai")
    missing = _openai_fields(route) - set(BY_ROUTE[route])  # type: ignore[index]
    assert not missing, f"engine/api/fields.py says nothing of {sorted(missing)} on {route}"


def test_fields_marked_openai_are_openai_fields() -> None:
    pytest.importorskip("openai")
    known = _openai_fields("chat") | _openai_fields("completions")
    invented = {field.name for field in FIELDS if field.openai} - known
    assert not invented, f"marked as OpenAI's but not in the openai package: {sorted(invented)}"


def test_openapi_document_lists_exactly_the_registry() -> None:
    paths = openapi_document("m")["paths"]
    for route, path in (("chat", "/v1/chat/completions"), ("completions", "/v1/completions")):
        schema = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert set(schema["properties"]) == set(BY_ROUTE[route])  # type: ignore[index]
        assert schema["additionalProperties"] is False


def test_every_refused_field_has_a_hand_written_refusal() -> None:
    refused = {field.name for field in FIELDS if field.disposition == "refused"}
    assert set(REFUSED) == refused


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_field_is_named(name: str) -> None:
    route, value = REFUSED[name]
    found = refusal(body(route, {name: value}, "m"), route)  # type: ignore[arg-type]
    assert found is not None and found[0] == name
    assert f"'{name}' is not supported" in found[1] and "remove it" in found[1]


@pytest.mark.parametrize(("name", "route", "value"), MORE_REFUSED)
def test_other_refused_shapes_are_named(name: str, route: str, value: Any) -> None:
    found = refusal(body(route, {name: value}, "m"), route)  # type: ignore[arg-type]
    assert found is not None and found[0] == name


@pytest.mark.parametrize(("name", "route", "value"), ACCEPTED)
def test_values_asking_nothing_more_are_accepted(name: str, route: str, value: Any) -> None:
    assert refusal(body(route, {name: value}, "m"), route) is None  # type: ignore[arg-type]


def test_a_refusal_is_named_before_an_ignored_field_of_the_wrong_type() -> None:
    found = refusal(body("chat", {"user": 7, "tools": REFUSED["tools"][1]}, "m"), "chat")
    assert found is not None and found[0] == "tools"
    found = refusal(body("chat", {"user": 7}, "m"), "chat")
    assert found == ("user", "'user' must be a string or null, got 7")
    found = refusal(body("chat", {"metadata": []}, "m"), "chat")
    assert found == ("metadata", "'metadata' must be an object or null, got []")


def test_unknown_and_misplaced_fields_are_named() -> None:
    found = refusal(body("completions", {"guided_json": {}}, "m"), "completions")
    assert found is not None and found[0] == "guided_json"
    found = refusal(body("chat", {"echo": False}, "m"), "chat")
    assert found is not None and found[0] == "echo" and "/v1/completions" in found[1]
    found = refusal(body("chat", {"stream_options": {"include_usage": True, "x": 1}}, "m"), "chat")
    assert found is not None and found[0] == "stream_options.x"


def test_true_is_not_one() -> None:
    found = refusal(body("chat", {"n": True}, "m"), "chat")
    assert found is not None and found[0] == "n"
