"""schemathesis against the API's own OpenAPI document: no 5xx, every 4xx is JSON with a message."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("torch")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402

if TYPE_CHECKING:
    from schemathesis.schemas import BaseSchema


@pytest.fixture(scope="module")
def api_schema() -> BaseSchema:
    """The API's own OpenAPI document, on an engine loaded when the test runs, not at import
    (collecting the suite must not load a model)."""
    from engine import Engine, EngineConfig
    from engine.api import create_app

    # Small max_tokens cap and context keep each generated request cheap on a CPU.
    engine = Engine.from_pretrained(
        "bundled:tiny", EngineConfig(max_tokens_cap=8, max_model_len=256)
    )
    return schemathesis.openapi.from_asgi("/openapi.json", create_app(engine))


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors_and_json_client_errors(case: Any) -> None:
    response = case.call()
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
