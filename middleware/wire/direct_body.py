"""Streamed body pieces written straight to the client's socket, past the ASGI `send` chain.

Behind `slo proxy` every SSE event of every stream would otherwise cost a task wake-up and a
coroutine `send` through each layer down to the server: most of the proxy's own CPU per event.
A server that can write the current response's body pieces itself offers that in the scope:

    scope["extensions"]["llm_slo.direct_body"] = DirectBody(send, ready, write)

- `send`: the ASGI send callable the offer is valid for. An app may use the offer only when
  the `send` it was given is this one (compared with `==`, as bound methods are): a layer in
  between that wraps `send` to see the body (and does not wrap the offer too) thus turns it
  off by itself, and nothing is ever written behind its back.
- `ready()`: True while a piece may be written now (the response has started, is chunked, not
  finished, the client is connected and not pushing back); else the app sends as usual.
- `write(body)`: writes one body piece (`more_body` true), as `send` would have.
- `offer(body)`: `write` it if `ready()` (True), else False. A server or a layer may give its
  own, doing both in one call (a stream's middle piece pays one call instead of three); it
  must answer exactly as `ready` and `write` would. It is fixed when the offer is made: a
  layer changes what is written by wrapping the offer (all three), never by editing one.

A layer that wants to see every piece (the latency middleware) wraps the offer with its own
`send`, `ready` and `write`, and puts its wrapper in the scope in its place
(`middleware.request.exchange`). The upstream client calls `offer` from its protocol callback, as
the bytes arrive (`middleware.proxy.client`); the end of the response, errors and anything that
could not be written at once still go through `send`, in order.
"""

from __future__ import annotations

from collections.abc import Callable

from middleware.types import Scope, Send

EXTENSION = "llm_slo.direct_body"


class DirectBody:
    """An offer to write the current response's streamed body pieces directly."""

    __slots__ = ("offer", "ready", "send", "write")

    def __init__(
        self,
        send: Send,
        ready: Callable[[], bool],
        write: Callable[[bytes], None],
        offer: Callable[[bytes], bool] | None = None,
    ) -> None:
        self.send = send
        self.ready = ready
        self.write = write
        # Write `body` now if the server can (True); False: send it through `send` instead.
        self.offer = _ready_then_write(ready, write) if offer is None else offer


def _ready_then_write(
    ready: Callable[[], bool], write: Callable[[bytes], None]
) -> Callable[[bytes], bool]:
    """`ready`, then `write`, as one offer (a closure: a bound method kept on the instance
    would make every offer a reference cycle, its request's objects left to the collector)."""

    def offer(body: bytes) -> bool:
        if ready():
            write(body)
            return True
        return False

    return offer


def direct_body(scope: Scope, send: Send) -> DirectBody | None:
    """The offer in `scope` valid for this `send`, or None (no offer, or `send` was wrapped)."""
    extensions = scope.get("extensions")
    if not extensions:
        return None
    offer = extensions.get(EXTENSION)
    if offer is None or offer.send != send:
        return None
    return offer  # type: ignore[no-any-return]


def put_direct_body(scope: Scope, offer: DirectBody) -> None:
    """Offer `offer` to the layers below (in place of the one it wraps, if any)."""
    scope.setdefault("extensions", {})[EXTENSION] = offer
