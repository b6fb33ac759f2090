"""The measured request's side of a direct body write (`middleware.wire.direct_body`).

When the server below offers direct writes for the request's `send`, the exchange offers the
app above its own: valid for `exchange.send`, ready only while the answer is an SSE stream (a
plain reply's body is kept for its usage, through `send`) and the server's offer is ready, and
writing a piece marks and reads it exactly as `Exchange.send` marks and reads a stream chunk
in the middle of the stream, then hands it to the server's `write`. Its `offer`, what the
upstream connection calls per piece, is `hotpath.measured_offer`: the same in one call. A
stream whose usage the client did not ask for takes that call too for every piece with nothing
to take out or hold (`WireReader.passes_as_is`), the reader's rewriting for the rest. The
stream's start and its last message still go through `send`, where the stream is settled.
"""

from __future__ import annotations

import middleware.hotpath as hotpath
from middleware.request.exchange import Exchange
from middleware.wire.direct_body import DirectBody


def measured_direct_body(exchange: Exchange, below: DirectBody) -> DirectBody:
    """An offer for the app above, valid for `exchange.send`, that measures every piece."""
    timeline, wire, now_ns = exchange.timeline, exchange.wire, exchange.now_ns
    ready_below, write_below = below.ready, below.write
    chunk_sent = timeline.chunk_sent

    def ready() -> bool:
        return exchange.is_stream and ready_below()

    if exchange.strip_usage:
        feed, passes_as_is = wire.feed, wire.passes_as_is
        offer_as_is = hotpath.measured_offer(exchange, below.offer)

        def write(body: bytes) -> None:
            started = now_ns()
            carried, sent = feed(body)
            chunk_sent(started, carried)
            write_below(sent)
            if not carried:
                exchange.quiet_piece_sent()

        def offer(body: bytes) -> bool:
            # Nearly every piece has nothing to take out or hold: the one-call offer takes it.
            if passes_as_is(body):
                return offer_as_is(body)
            if not ready():
                return False
            write(body)
            return True

        return DirectBody(exchange.send, ready, write, offer)

    token_events_in = wire.token_events_in

    def write_as_is(body: bytes) -> None:
        started = now_ns()
        carried = token_events_in(body)
        chunk_sent(started, carried)
        write_below(body)
        if not carried:
            exchange.quiet_piece_sent()

    # What the upstream connection calls for each piece: readiness, the server's write, the
    # marks and the scan in one hot-path call (compiled where built), over the server's own
    # one-call offer.
    offer = hotpath.measured_offer(exchange, below.offer)
    return DirectBody(exchange.send, ready, write_as_is, offer)
