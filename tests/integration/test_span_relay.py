"""The span relay between workers, on real unix datagram sockets: two span joins (two workers'),
each with its relay in one directory. A span reaching the wrong worker is placed by its owner
exactly as its own would be; a span no worker owns is counted unmatched once, where it came."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from middleware.intake import SpanJoin, propagate
from middleware.intake.relay import SpanRelay, check_relay_dir, relay_dir
from middleware.upstream import SpanPhases


@asynccontextmanager
async def two_workers() -> AsyncIterator[tuple[SpanJoin, SpanRelay, SpanJoin, SpanRelay]]:
    # A short directory: sun_path holds 108 bytes, pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="relay-") as shared:
        directory = relay_dir(Path(shared))
        loop = asyncio.get_running_loop()
        joins = [SpanJoin(5.0, expect="always"), SpanJoin(5.0, expect="always")]
        relays = [SpanRelay(directory, join) for join in joins]
        for relay in relays:
            relay.start(loop)
        try:
            yield joins[0], relays[0], joins[1], relays[1]
        finally:
            for relay in relays:
                relay.close()
            propagate.set_owner_tag("")


async def settle_soon(join: SpanJoin) -> None:
    for _ in range(100):
        await asyncio.sleep(0.01)
        if not join.waiting:
            return


def test_a_span_at_the_wrong_worker_joins_at_its_owner() -> None:
    async def scenario() -> None:
        async with two_workers() as (join_a, _relay_a, join_b, relay_b):
            # Worker B's request: the trace id it minted starts with its tag.
            trace_b = relay_b.tag + "1" * 24
            reports: list[SpanPhases | None] = []
            join_b.begin(trace_b, None)
            join_b.end(trace_b, None)
            assert join_b.settle(trace_b, None, reports.append) == 5.0  # waits for its span
            span = SpanPhases(trace_b, queue_s=0.01, prefill_s=0.02, decode_s=0.03)
            # The export reaches worker A.
            assert join_a.wanted(span.trace_id, span.request_id)
            join_a.add([span])
            await settle_soon(join_b)
            assert reports == [span]
            assert join_b.counts.joined == 1 and join_b.counts.spans == 1
            assert join_a.counts.spans == 0 and join_a.counts.unmatched == 0
            # A second copy: a duplicate, counted by the owner.
            assert join_a.wanted(span.trace_id, None)
            join_a.add([span])
            await asyncio.sleep(0.1)
            assert join_b.counts.duplicates == 1 and join_a.counts.duplicates == 0
            # A span of nobody's: unmatched once, where it came, never read.
            assert not join_a.wanted("ab" * 16, None)
            await asyncio.sleep(0.1)
            assert (join_a.counts.unmatched, join_b.counts.unmatched) == (1, 0)

    asyncio.run(scenario())


def test_by_request_id_and_the_owner_forgetting_it() -> None:
    async def scenario() -> None:
        async with two_workers() as (join_a, _relay_a, join_b, relay_b):
            # The X-Request-Id B sent upstream (vLLM reports it prefixed: chatcmpl-<id>).
            propagate.set_owner_tag(relay_b.tag)
            upstream_id = propagate.mint_upstream_id()
            assert upstream_id.startswith(relay_b.tag)
            reports: list[SpanPhases | None] = []
            join_b.begin("client-trace", upstream_id)  # the client sent its own traceparent
            join_b.end("client-trace", upstream_id)
            join_b.settle("client-trace", upstream_id, reports.append)
            span = SpanPhases("cd" * 16, request_id=f"chatcmpl-{upstream_id}", queue_s=0.5)
            assert join_a.wanted(span.trace_id, span.request_id)
            join_a.add([span])
            await settle_soon(join_b)
            assert reports == [span]
            # A span naming B's tag for a request B never had: unmatched at B, once.
            stray = SpanPhases(relay_b.tag + "2" * 24, queue_s=0.5)
            assert join_a.wanted(stray.trace_id, None)
            join_a.add([stray])
            await asyncio.sleep(0.1)
            assert (join_a.counts.unmatched, join_b.counts.unmatched) == (0, 1)

    asyncio.run(scenario())


def test_a_worker_gone_counts_its_spans_unmatched_where_they_came() -> None:
    async def scenario() -> None:
        async with two_workers() as (join_a, relay_a, join_b, relay_b):
            tag_b = relay_b.tag
            relay_b.close()
            relay_a._peers_at = float("-inf")  # as a second after B left
            assert not join_a.wanted(tag_b + "3" * 24, None)
            assert join_a.counts.unmatched == 1 and join_b.counts.spans == 0

    asyncio.run(scenario())


def test_spans_seen_anywhere_make_every_worker_wait_for_them() -> None:
    async def scenario() -> None:
        async with two_workers() as (join_a, _relay_a, join_b, _relay_b):
            join_a.expect = join_b.expect = "auto"
            assert not join_b.expects_spans()
            join_a.wanted("ab" * 16, None)
            join_a.add([])  # an export of nobody's spans still says the engine exports them
            await asyncio.sleep(0.1)
            assert join_b.expects_spans()

    asyncio.run(scenario())


def test_a_directory_too_long_for_a_socket_path_names_the_fix() -> None:
    with pytest.raises(ValueError, match="PROMETHEUS_MULTIPROC_DIR to a shorter directory"):
        check_relay_dir(Path("/" + "d" * 120))
