"""schemathesis against the API's own OpenAPI document: no 5xx, every 4xx is JSON with a message."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402

from engine import Engine, EngineConfig  # noqa: E402
from engine.api import create_app  # noqa: E402

# Small max_tokens cap and context keep each generated request cheap on a CPU.
ENGINE = Engine.from_pretrained("bundled:tiny", EngineConfig(max_tokens_cap=8, max_model_len=256))
schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(ENGINE))


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors_and_json_client_errors(case: Any) -> None:
    response = case.call()
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
