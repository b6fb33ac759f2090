"""Where a request's clock starts: at its first byte, where the server tells it, else at the ASGI
call.

An ASGI server sees a request's first byte before it has read and parsed the headers and called
the app; that wait (a client trickling its headers, the server's own parsing, its buffers under
load) is the client's latency too. A server that knows the first byte's time hands it over in
the scope, in the middleware clock's nanoseconds (`time.perf_counter_ns()` for the system
clock):

    scope["extensions"]["llm_slo.first_byte"] = {
        "at_ns": first_byte_ns,  # when the request's first byte was read
        "connection_accepted_ns": accepted_ns,  # the first request of a new connection only
    }

`slo proxy` serves on such a protocol (`slo.cli.proxy.direct`). The record says where its clock
started (`clock_start`: "first_byte" or "asgi_call"), how long from the first byte to the app
(`before_app_s`, a part of network) and, for a new connection's first request, how long from
accepting the connection to that byte (`connection_s`: a TLS handshake, a slow client; not in
e2e, which starts at the first byte).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from middleware.request.timeline import RequestTimeline

NS = 1e-9
EXTENSION = "llm_slo.first_byte"
FIRST_BYTE = "first_byte"
ASGI_CALL = "asgi_call"
# A first byte read longer ago than this is not this request's (a clock of another domain).
_OLDEST_NS = 3_600 * 1_000_000_000


def first_byte(scope: Any, now_ns: int) -> tuple[int, int | None] | None:
    """(first byte ns, connection accepted ns or None) the server handed over, if it did and
    they are plausible (not after `now_ns`, not an hour before it); else None."""
    extensions = scope.get("extensions")
    if not extensions:
        return None
    told = extensions.get(EXTENSION)
    if not isinstance(told, dict):
        return None
    at_ns = told.get("at_ns")
    if type(at_ns) is not int or not 0 <= now_ns - at_ns <= _OLDEST_NS:
        return None
    accepted_ns = told.get("connection_accepted_ns")
    if type(accepted_ns) is not int or not 0 <= at_ns - accepted_ns <= _OLDEST_NS:
        accepted_ns = None
    return at_ns, accepted_ns


def put_first_byte(scope: Any, at_ns: int, connection_accepted_ns: int | None) -> None:
    """What a server does to hand over the first byte's time (see the module's docstring)."""
    told: dict[str, int] = {"at_ns": at_ns}
    if connection_accepted_ns is not None:
        told["connection_accepted_ns"] = connection_accepted_ns
    scope.setdefault("extensions", {})[EXTENSION] = told


def start_at_first_byte(timeline: RequestTimeline, scope: Any) -> None:
    """Start `timeline`'s clock at the request's first byte, where the server told it; its
    start so far (the ASGI call) is kept as `app_call_ns`."""
    told = first_byte(scope, timeline.start_ns)
    if told is None:
        return
    at_ns, timeline.connection_accepted_ns = told
    timeline.app_call_ns = called = timeline.start_ns
    timeline.wall_start_s -= (called - at_ns) * NS
    timeline.start_ns = at_ns


def arrival_fields(timeline: RequestTimeline) -> tuple[str, float | None, float | None]:
    """The record's (clock_start, before_app_s, connection_s) of a timeline."""
    called = timeline.app_call_ns
    if called is None:
        return ASGI_CALL, None, None
    accepted = timeline.connection_accepted_ns
    connection_s = None if accepted is None else (timeline.start_ns - accepted) * NS
    return FIRST_BYTE, (called - timeline.start_ns) * NS, connection_s
