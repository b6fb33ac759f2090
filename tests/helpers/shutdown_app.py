"""The ASGI app of the shutdown tests (tests/integration/test_shutdown_servers.py), for servers
that import an app by name: `uvicorn tests.helpers.shutdown_app:app`.

`app` is LatencyMiddleware around an OpenAI-style SSE upstream; with LLM_SLO_TEST_LIFESPAN=0 the
upstream raises on the lifespan scope, as many raw apps do. Records go to the store named by
LLM_SLO_TEST_STORE. Chosen by environment, not by name: hypercorn looks names up in the
module's globals, and each server process should open the store once, for the app it serves.
"""

from __future__ import annotations

import os

from middleware import LatencyMiddleware
from middleware.types import ASGIApp, Receive, Scope, Send
from tests.helpers.proxy_upstream import OpenAIUpstream

# Each chunk waits this long: a burst stays in flight for a few hundred milliseconds.
ITL_S = 0.02


class WithoutLifespan:
    """An app that does not speak lifespan: it raises on the scope before reading a message."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            raise RuntimeError(f"unsupported scope type {scope['type']!r}")
        await self.app(scope, receive, send)


def build() -> LatencyMiddleware:
    upstream: ASGIApp = OpenAIUpstream(itl_s=ITL_S)
    if os.environ.get("LLM_SLO_TEST_LIFESPAN", "1") == "0":
        upstream = WithoutLifespan(upstream)
    return LatencyMiddleware(upstream, store=os.environ["LLM_SLO_TEST_STORE"], model="sse-test")


app = build()
