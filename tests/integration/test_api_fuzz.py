"""schemathesis against the API's own OpenAPI document: no 5xx, every 4xx is JSON with a message."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402

from engine.api.openapi import openapi_document  # noqa: E402

MODEL = "bundled:tiny"


class EngineOnFirstRequest:
    """The API app, its engine loaded by the first request the fuzzer sends, not when the suite
    is collected (the OpenAPI document needs no engine: it is built from the model's name)."""

    def __init__(self) -> None:
        self.app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.app is None:
            from engine import Engine, EngineConfig
            from engine.api import create_app

            # Small max_tokens cap and context keep each generated request cheap on a CPU.
            engine = Engine.from_pretrained(
                MODEL, EngineConfig(max_tokens_cap=8, max_model_len=256)
            )
            self.app = create_app(engine)
        await self.app(scope, receive, send)


schema = schemathesis.openapi.from_dict(openapi_document(MODEL))
schema.app = EngineOnFirstRequest()


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors_and_json_client_errors(case: Any) -> None:
    response = case.call()
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
