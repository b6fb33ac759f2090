"""API keys and content capture are ASGI layers of their own: each works alone, and
`LatencyMiddleware(auth=..., capture=...)` stacks them inside the measurement."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from middleware import LatencyMiddleware
from middleware.auth import ApiKeyAuth, ApiKeyMiddleware
from middleware.capture import CaptureMiddleware, ContentCapture
from middleware.config import MiddlewareConfig
from slo.spec import SLOSpec
from slo.store import RecordStore
from tests.helpers.api_key_app import KEY, call, echo_app, keys_file

ROUTES = ("/v1/completions",)


def test_the_key_layer_alone_refuses_and_hands_on_the_tier(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(dict(scope["state"]))
        await echo_app(scope, receive, send)

    spec = SLOSpec.default()
    auth = ApiKeyAuth.load(keys_file(tmp_path))
    layer = ApiKeyMiddleware(app, auth, spec, ROUTES)
    status, _headers, _body = asyncio.run(call(layer, {}))
    assert status == 401 and seen == []
    status, _headers, _body = asyncio.run(call(layer, {"authorization": f"Bearer {KEY}"}))
    assert status == 200
    (state,) = seen
    assert state["api_key_id"] == "acme" and state["tier"] == "premium"
    assert callable(state["charge_tokens"])
    status, _headers, _body = asyncio.run(call(layer, {}, path="/health"))
    assert status == 200  # other routes pass through


def test_the_capture_layer_alone_keeps_both_bodies() -> None:
    states: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        states.append(scope["state"])
        await echo_app(scope, receive, send)

    layer = CaptureMiddleware(app, ContentCapture(max_chars=64), ROUTES)
    asyncio.run(call(layer, {}, body=b'{"prompt": "hello"}'))
    buffer = states[0]["capture"]
    assert b"".join(buffer.request) == b'{"prompt": "hello"}'
    assert b"hello" in b"".join(buffer.response)


def test_latency_middleware_stacks_the_key_layer_inside(tmp_path: Path) -> None:
    store = RecordStore(f"sqlite:///{tmp_path / 'records.db'}")
    app = LatencyMiddleware(
        echo_app, store=store, config=MiddlewareConfig.of(auth=keys_file(tmp_path))
    )
    assert isinstance(app.app, ApiKeyMiddleware)
    asyncio.run(call(app, {}))  # refused, and recorded
    asyncio.run(call(app, {"x-api-key": KEY}))
    app.close()
    records = store.query()
    assert sorted(r.status_code for r in records) == [200, 401]
    store.close()
