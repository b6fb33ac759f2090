"""Hand the engine our trace context, so its request span lands in our trace.

The engine (vLLM, SGLang, TGI) makes its request span a child of the W3C `traceparent` the
request carries. We send one naming our own request span (the client's trace id when it sent
one, a new one otherwise) and an `X-Request-Id` when the client sent none: the keys the span
join finds the engine's span by. The id we send is a UUID made from our request id
(`upstream_request_id`): servers that validate the header as one (llama-cpp-python's, through
starlette-context) answer anything else with a 400.

With several workers (`middleware.intake.relay`) the ids this process mints begin with its
worker's tag (4 bytes), so the worker an engine span reaches knows whose request it is; the
rest stays random (OpenTelemetry's ratio sampler reads a trace id's last 8 bytes).
"""

from __future__ import annotations

import hashlib
import random

from middleware.types import Scope

_owner_tag = b""  # this worker's tag, in front of the ids it mints; none with one worker


def set_owner_tag(tag_hex: str) -> None:
    """Put this worker's tag (8 hex digits; '' for none) in front of every id minted from now
    on."""
    global _owner_tag
    tag = bytes.fromhex(tag_hex)
    if tag and len(tag) != 4:
        raise ValueError(f"worker tag {tag_hex!r}: use 8 hex digits")
    _owner_tag = tag


# (request id, worker tag, its upstream id): asked twice in a row for each request.
_last_minted = ("", b"", "")


def upstream_request_id(request_id: str) -> str:
    """The `X-Request-Id` sent upstream for our request `request_id`: a version-4 UUID made
    from it (the same one every time, so the join finds the engine's span by it). Formatted
    by hand, as `str(uuid.UUID(bytes=..., version=4))` writes it, at a tenth of its cost."""
    global _last_minted
    tag = _owner_tag
    if _last_minted[0] == request_id and _last_minted[1] == tag:
        return _last_minted[2]
    digest = hashlib.md5(request_id.encode(), usedforsecurity=False).digest()
    raw = bytearray(tag + digest[len(tag) :])
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # the RFC 4122 variant
    text = raw.hex()
    minted = f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
    _last_minted = (request_id, tag, minted)
    return minted


def _random_hex(size: int) -> str:
    """`size` random bytes in hex, never all zero (an invalid W3C id); OpenTelemetry's own id
    generator draws from `random` too."""
    return f"{random.getrandbits(8 * size) or 1:0{2 * size}x}"


def propagate_context(scope: Scope, headers: dict[str, str], request_id: str) -> tuple[str, str]:
    """Rewrite the request's `traceparent` (and add `x-request-id` if missing) in `scope`;
    (trace id, span id) in hex. `headers` are the client's, left as they came."""
    parts = headers.get("traceparent", "").split("-")
    valid = len(parts) == 4 and len(parts[1]) == 32 and len(parts[2]) == 16
    tag = _owner_tag
    trace_id = parts[1].lower() if valid else tag.hex() + _random_hex(16 - len(tag))
    flags = parts[3][:2] if valid and len(parts[3]) >= 2 else "01"
    span_id = _random_hex(8)
    raw = list(scope.get("headers", ()))
    if "traceparent" in headers:  # the client's, replaced by ours
        raw = [(key, value) for key, value in raw if key.lower() != b"traceparent"]
    raw.append((b"traceparent", f"00-{trace_id}-{span_id}-{flags}".encode()))
    if "x-request-id" not in headers:
        raw.append((b"x-request-id", upstream_request_id(request_id).encode()))
    scope["headers"] = raw
    return trace_id, span_id
