"""`EngineRequestState`: the keys of the ASGI scope's state that the API reads and writes.

A middleware in front (llm-slo's, or any other) may hand each request a `priority` (lower is
served first) and a `request_id`; the API writes how a request ended when its status alone
does not say it (`outcome`: shed, timeout, server_error) and why it was shed. The engine
imports nothing of the middleware's: these are the middleware's `RequestState` keys the engine
uses, written out, and a test holds the two to the same names and types.
"""

from __future__ import annotations

from typing import Any, TypedDict, cast


class EngineRequestState(TypedDict, total=False):
    request_id: str
    priority: int
    outcome: str
    shed_reason: str


def engine_request_state(scope: dict[str, Any]) -> EngineRequestState:
    """The request's state, made empty where no layer in front has made it."""
    state: dict[str, Any] = scope.setdefault("state", {})
    return cast(EngineRequestState, state)
