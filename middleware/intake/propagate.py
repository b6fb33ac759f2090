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

from random import getrandbits

try:  # CPython's own MD5: the same digest without an OpenSSL context per call (a third of it)
    from _md5 import md5
except ImportError:  # pragma: no cover - a build without it
    from hashlib import md5

from middleware.types import Scope

_owner_tag = ""  # this worker's tag (hex), in front of the ids it mints; none with one worker
# The random part of a minted trace id: its bits, and its format (the tag's digits left out).
_trace_bits = 128
_trace_format = "032x"
_tag_number = 0  # the tag in its place in a trace id's number
# The request id asked last and its upstream id: each request asks twice in a row.
_last_request_id = ""
_last_minted = ""
# The UUID variant's hex digit for each hex digit of the hash: the RFC 4122 bits (10xx).
_VARIANT_DIGIT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


def set_owner_tag(tag_hex: str) -> None:
    """Put this worker's tag (8 hex digits; '' for none) in front of every id minted from now
    on."""
    global _owner_tag, _trace_bits, _trace_format, _tag_number, _last_request_id
    tag = bytes.fromhex(tag_hex)
    if tag and len(tag) != 4:
        raise ValueError(f"worker tag {tag_hex!r}: use 8 hex digits")
    _owner_tag = tag.hex()
    _trace_bits = 8 * (16 - len(tag))
    _trace_format = f"0{2 * (16 - len(tag))}x"
    _tag_number = int.from_bytes(tag, "big") << _trace_bits  # 0 without a tag
    _last_request_id = ""  # minted under the old tag


def upstream_request_id(request_id: str) -> str:
    """The `X-Request-Id` sent upstream for our request `request_id`: a version-4 UUID made
    from it (the same one every time, so the join finds the engine's span by it). Written
    from the hash's hex digits, as `str(uuid.UUID(bytes=..., version=4))` writes it, at a
    tenth of its cost."""
    global _last_request_id, _last_minted
    if request_id == _last_request_id:
        return _last_minted
    text = md5(request_id.encode(), usedforsecurity=False).hexdigest()
    tag = _owner_tag
    if tag:
        text = tag + text[len(tag) :]
    variant = _VARIANT_DIGIT[text[16]]  # and version 4: the 13th digit
    minted = f"{text[:8]}-{text[8:12]}-4{text[13:16]}-{variant}{text[17:20]}-{text[20:]}"
    _last_request_id, _last_minted = request_id, minted
    return minted


# (trace id, span id) in hex, then as numbers, the trace id's only where we drew it (the
# client's is read when its span is made): the span takes them without parsing them back.
HandedIds = tuple[str, str, int | None, int]


def propagate_context(scope: Scope, headers: dict[str, str], request_id: str) -> HandedIds:
    """Rewrite the request's `traceparent` (and add `x-request-id` if missing) in `scope`;
    the ids it names (`HandedIds`). `headers` are the client's, left as they came.

    Ids are never all zero (invalid in W3C); drawn from `random`, as OpenTelemetry's own id
    generator draws them."""
    raw = scope.get("headers", ())
    trace_id = flags = trace_number = None
    if "traceparent" in headers:  # the client's: its trace goes on, under our span
        parts = headers["traceparent"].split("-")
        if len(parts) == 4 and len(parts[1]) == 32 and len(parts[2]) == 16:
            trace_id = parts[1].lower()
            flags = parts[3][:2] if len(parts[3]) >= 2 else None
        raw = [(key, value) for key, value in raw if key.lower() != b"traceparent"]
    if trace_id is None:
        drawn = getrandbits(_trace_bits) or 1
        trace_id = f"{_owner_tag}{drawn:{_trace_format}}"
        trace_number = _tag_number | drawn
    span_number = getrandbits(64) or 1
    span_id = f"{span_number:016x}"
    traceparent = (b"traceparent", f"00-{trace_id}-{span_id}-{flags or '01'}".encode())
    if "x-request-id" in headers:
        scope["headers"] = [*raw, traceparent]
    else:
        upstream_id = upstream_request_id(request_id).encode()
        scope["headers"] = [*raw, traceparent, (b"x-request-id", upstream_id)]
    return trace_id, span_id, trace_number, span_number
