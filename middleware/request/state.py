"""`RequestState`: the keys of a measured request's `scope["state"]`, named once.

The layers of one request tell each other through the ASGI scope's state: the measuring layer
(`middleware.core`) hands the app the request's id, tier and priority; the API key's layer
(`middleware.auth`) may decide the tier and is charged the tokens; the app (the bundled
engine's API, `slo proxy`) says how the request ended when its status alone does not. The
bundled engine's API cannot import the middleware: `engine/api/state.py` writes out the keys it
reads and writes, and tests/unit/middleware/test_request_state.py holds them to these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict, cast

if TYPE_CHECKING:
    from middleware.capture import CaptureBuffer
    from middleware.types import Scope


class RequestState(TypedDict, total=False):
    request_id: str  # the middleware's id of the request, handed to the engine
    tier: str  # the spec's tier; the API key's layer may decide it
    priority: int  # the tier's priority: lower is served first
    api_key_id: str  # the caller's API key (its id, never the key)
    charge_tokens: Callable[[int], None]  # the key's tokens-per-minute bucket, charged at the end
    outcome: str  # the app's word on how it ended: shed, timeout, server_error
    shed_reason: str  # why the engine shed it (queue_full, deadline, ...)
    capture: CaptureBuffer  # the bodies, when content capture is on


def request_state(scope: Scope) -> RequestState:
    """The request's state, made empty where no layer has made it yet."""
    state: dict[str, Any] = scope.setdefault("state", {})
    return cast(RequestState, state)
