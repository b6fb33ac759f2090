"""Hand the engine our trace context, so its request span lands in our trace.

The engine (vLLM, SGLang, TGI) makes its request span a child of the W3C `traceparent` the
request carries. We send one naming our own request span (the client's trace id when it sent
one, a new one otherwise) and an `X-Request-Id` (ours) when the client sent none: the keys
the span join finds the engine's span by.
"""

from __future__ import annotations

import os

from middleware.types import Scope


def propagate_context(scope: Scope, headers: dict[str, str], request_id: str) -> tuple[str, str]:
    """Rewrite the request's `traceparent` (and add `x-request-id` if missing) in `scope`;
    (trace id, span id) in hex. `headers` are the client's, left as they came."""
    parts = headers.get("traceparent", "").split("-")
    valid = len(parts) == 4 and len(parts[1]) == 32 and len(parts[2]) == 16
    trace_id = parts[1].lower() if valid else os.urandom(16).hex()
    flags = parts[3][:2] if valid and len(parts[3]) >= 2 else "01"
    span_id = os.urandom(8).hex()
    raw = [(key, value) for key, value in scope.get("headers", ()) if key.lower() != b"traceparent"]
    raw.append((b"traceparent", f"00-{trace_id}-{span_id}-{flags}".encode()))
    if "x-request-id" not in headers:
        raw.append((b"x-request-id", request_id.encode()))
    scope["headers"] = raw
    return trace_id, span_id
