"""Hand the engine our trace context, so its request span lands in our trace.

The engine (vLLM, SGLang, TGI) makes its request span a child of the W3C `traceparent` the
request carries. We send one naming our own request span (the client's trace id when it sent
one, a new one otherwise) and an `X-Request-Id` when the client sent none: the keys the span
join finds the engine's span by. The id we send is a version-4 UUID: servers that validate the
header as one (llama-cpp-python's, through starlette-context) answer anything else with a 400.
Its first 20 hex digits are drawn once per process, its last 12 count the requests: unique,
and minted with one format per request (no hash, no random draw).

With several workers (`middleware.intake.relay`) the ids this process mints begin with its
worker's tag (4 bytes), so the worker an engine span reaches knows whose request it is; the
rest stays random (OpenTelemetry's ratio sampler reads a trace id's last 8 bytes).
"""

from __future__ import annotations

import itertools
from random import getrandbits

from middleware.types import Scope

_owner_tag = ""  # this worker's tag (hex), in front of the ids it mints; none with one worker
_trace_mask = (1 << 128) - 1  # the random bits of a minted trace id (below the tag)
_tag_number = 0  # the tag in its place in a trace id's number
_SPAN_MASK = (1 << 64) - 1
# The UUID variant's hex digit for each hex digit: the RFC 4122 bits (10xx).
_VARIANT_DIGIT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}
_COUNT_MASK = (1 << 48) - 1  # the request count's 12 hex digits (wraps after 2.8e14)
_request_count = itertools.count(1)  # process-wide: every middleware's ids differ
_uuid_head = ""  # the first 20 hex digits of every X-Request-Id minted, dashes in place


def _draw_uuid_head() -> str:
    """`xxxxxxxx-xxxx-4xxx-Vxxx-`: drawn digits (the tag's in front), version 4, variant."""
    text = _owner_tag + f"{getrandbits(80):020x}"[len(_owner_tag) :]
    variant = _VARIANT_DIGIT[text[16]]
    return f"{text[:8]}-{text[8:12]}-4{text[13:16]}-{variant}{text[17:20]}-"


def set_owner_tag(tag_hex: str) -> None:
    """Put this worker's tag (8 hex digits; '' for none) in front of every id minted from now
    on."""
    global _owner_tag, _trace_mask, _tag_number, _uuid_head
    tag = bytes.fromhex(tag_hex)
    if tag and len(tag) != 4:
        raise ValueError(f"worker tag {tag_hex!r}: use 8 hex digits")
    _owner_tag = tag.hex()
    random_bits = 8 * (16 - len(tag))
    _trace_mask = (1 << random_bits) - 1
    _tag_number = int.from_bytes(tag, "big") << random_bits  # 0 without a tag
    _uuid_head = _draw_uuid_head()


set_owner_tag("")


def mint_upstream_id() -> str:
    """A new `X-Request-Id` to send upstream: a version-4 UUID, this process's head (its
    worker's tag in front) and the next request count."""
    return f"{_uuid_head}{next(_request_count) & _COUNT_MASK:012x}"


# (trace id, span id) in hex, then as numbers, the trace id's only where we drew it (the
# client's is read when its span is made), then the X-Request-Id we sent (None where the
# client sent its own): the span takes them without parsing them back.
HandedIds = tuple[str, str, int | None, int, str | None]


def propagate_context(scope: Scope, headers: dict[str, str]) -> HandedIds:
    """Rewrite the request's `traceparent` (and add `x-request-id` if missing) in `scope`;
    the ids it names (`HandedIds`). `headers` are the client's, left as they came.

    Ids are never all zero (invalid in W3C); drawn from `random` (one draw for both), as
    OpenTelemetry's own id generator draws them."""
    raw = scope.get("headers", ())
    trace_id = flags = trace_number = None
    if "traceparent" in headers:  # the client's: its trace goes on, under our span
        parts = headers["traceparent"].split("-")
        if len(parts) == 4 and len(parts[1]) == 32 and len(parts[2]) == 16:
            trace_id = parts[1].lower()
            flags = parts[3][:2] if len(parts[3]) >= 2 else None
        raw = [(key, value) for key, value in raw if key.lower() != b"traceparent"]
    bits = getrandbits(192)
    if trace_id is None:
        trace_number = _tag_number | ((bits >> 64) & _trace_mask or 1)
        trace_id = f"{trace_number:032x}"
    span_number = bits & _SPAN_MASK or 1
    span_id = f"{span_number:016x}"
    traceparent = (b"traceparent", f"00-{trace_id}-{span_id}-{flags or '01'}".encode())
    if "x-request-id" in headers:
        scope["headers"] = [*raw, traceparent]
        return trace_id, span_id, trace_number, span_number, None
    upstream_id = mint_upstream_id()
    scope["headers"] = [*raw, traceparent, (b"x-request-id", upstream_id.encode())]
    return trace_id, span_id, trace_number, span_number, upstream_id
