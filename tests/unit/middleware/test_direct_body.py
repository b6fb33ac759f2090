"""Direct body writes (middleware.wire.direct_body): an offer is used only by the `send` it was made
for, and the upstream connection keeps the pieces' order whichever way each one goes (straight
to the client from its callback, or through the proxy's task when the client pushes back)."""

from __future__ import annotations

import asyncio
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from middleware.proxy.client import UpstreamConnection
from middleware.wire.direct_body import EXTENSION, DirectBody, direct_body, put_direct_body


async def _send(message: dict[str, object]) -> None:
    return None


async def _other_send(message: dict[str, object]) -> None:
    return None


class _Server:
    """Where written pieces land; `ready` follows a script (the client pushing back or not)."""

    def __init__(self, readiness: list[bool]) -> None:
        self.readiness = readiness
        self.out: list[bytes] = []

    def ready(self) -> bool:
        return self.readiness.pop(0) if self.readiness else True

    def write(self, body: bytes) -> None:
        self.out.append(body)


def test_an_offer_serves_only_the_send_it_was_made_for() -> None:
    server = _Server([])
    offer = DirectBody(_send, server.ready, server.write)
    scope: dict[str, object] = {"type": "http"}
    assert direct_body(scope, _send) is None  # no extensions at all
    put_direct_body(scope, offer)
    assert scope["extensions"] == {EXTENSION: offer}
    assert direct_body(scope, _send) is offer
    # a layer that wrapped `send` (and not the offer) turns it off for the app below it
    assert direct_body(scope, _other_send) is None
    assert offer.offer(b"x") is True and server.out == [b"x"]
    server.readiness = [False]
    assert offer.offer(b"y") is False and server.out == [b"x"]


class _Transport:
    """The upstream socket's writing side, for a connection fed by hand (determinism)."""

    def write(self, data: bytes) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def abort(self) -> None:
        pass


def _chunked(pieces: list[bytes]) -> list[bytes]:
    return [b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces] + [b"0\r\n\r\n"]


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(1, 40),
    readiness=st.lists(st.booleans(), max_size=60),
    seed=st.integers(0, 2**16),
)
def test_pieces_keep_their_order_whichever_way_they_go(
    count: int, readiness: list[bool], seed: int
) -> None:
    pieces = [b"data: %d\n\n" % index for index in range(count)]
    delivered = asyncio.run(_relay(pieces, readiness, random.Random(seed)))
    # httptools hands a chunk over in as many parts as it arrived in: the bytes are the order
    assert b"".join(delivered) == b"".join(pieces)


async def _relay(pieces: list[bytes], readiness: list[bool], draw: random.Random) -> list[bytes]:
    """Feed the response in random slices while a task relays what it reads, as ProxyApp does;
    what reached the client, in order, from both routes."""
    loop = asyncio.get_running_loop()
    connection = UpstreamConnection(loop, read_timeout_s=30)
    connection.connection_made(_Transport())  # type: ignore[arg-type]
    connection.send_request(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"".join(_chunked(pieces))
    server = _Server(list(readiness))
    delivered: list[bytes] = []
    server.out = delivered  # the direct route appends here ...

    async def task() -> None:
        await connection.response_headers()
        connection.sink = DirectBody(_send, server.ready, server.write).offer
        while (piece := await connection.read()) is not None:
            await asyncio.sleep(0)  # a send that yields, as a real one may
            delivered.append(piece)  # ... and the task's route here

    relay = asyncio.ensure_future(task())
    at = 0
    while at < len(wire):
        step = draw.randint(1, 64)
        connection.data_received(wire[at : at + step])
        at += step
        for _ in range(draw.randint(0, 3)):
            await asyncio.sleep(0)  # let the task run now and then, or not
    await asyncio.wait_for(relay, 5)
    return delivered


def test_the_proxy_servers_one_call_offer_answers_as_ready_then_write() -> None:
    """`slo proxy`'s server offer (`slo.cli.proxy.direct`) in every state of uvicorn's cycle
    and flow control: it writes, and says True, exactly when `ready()` is True (an empty piece
    is taken and writes nothing), so the one call never drifts from the two."""
    import itertools

    from slo.cli.proxy.direct import _offer
    from tests.helpers.cycle_standin import cycle_standin

    for chunked, started, complete, paused, gone in itertools.product(
        (True, False, None), (True, False), (True, False), (True, False), (True, False)
    ):
        for body in (b"data: x\n\n", b""):
            written: list[bytes] = []
            state = {"chunked": chunked, "started": started, "complete": complete}
            state |= {"paused": paused, "gone": gone}
            offer = _offer(cycle_standin(written.append, _send, **state))
            ready = offer.ready()
            assert offer.offer(body) is ready
            framed = [b"%x\r\n%s\r\n" % (len(body), body)] if body else []
            assert written == (framed if ready else [])
            written.clear()
            offer.write(body)  # what `ready` and `write` do, one after the other
            assert written == framed
