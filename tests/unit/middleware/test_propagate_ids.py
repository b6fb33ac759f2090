"""The ids `slo proxy` and the mounted middleware hand the engine: the X-Request-Id is a
version-4 UUID as `uuid` itself writes it (formatted by hand for speed), distinct per request and
led by the worker's tag; the traceparent's ids are well-formed and never all zero."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest

from middleware.intake import propagate


@pytest.fixture(autouse=True)
def no_tag() -> Iterator[None]:
    yield
    propagate.set_owner_tag("")


@pytest.mark.parametrize("tag", ["", "0a0b0c0d", "ffffffff"])
def test_minted_request_ids_are_version_4_uuids_distinct_and_tagged(tag: str) -> None:
    propagate.set_owner_tag(tag)
    minted = [propagate.mint_upstream_id() for _ in range(2000)]
    for text in minted[:50] + minted[-50:]:
        parsed = uuid.UUID(text)
        assert str(parsed) == text and parsed.version == 4  # as `uuid` writes it, variant too
        assert text.startswith(tag[:8])
    assert len(set(minted)) == len(minted)
    heads = {text[:24] for text in minted}
    assert len(heads) == 1  # one drawn head per process (per tag); the count runs below it
    propagate.set_owner_tag(tag)
    assert propagate.mint_upstream_id()[:24] != minted[0][:24]  # a new tag: a new head


def test_minted_traceparent_ids_are_well_formed_and_distinct() -> None:
    seen = set()
    for _ in range(200):
        scope = {"headers": [(b"traceparent", b"garbage")]}
        trace_id, span_id, trace_number, span_number, upstream_id = propagate.propagate_context(
            scope, {}
        )
        assert (trace_number, span_number) == (int(trace_id, 16), int(span_id, 16))
        assert re.fullmatch(r"[0-9a-f]{32}", trace_id) and trace_id != "0" * 32
        assert re.fullmatch(r"[0-9a-f]{16}", span_id) and span_id != "0" * 16
        sent = dict(scope["headers"])
        assert sent[b"traceparent"] == f"00-{trace_id}-{span_id}-01".encode()
        assert upstream_id is not None and sent[b"x-request-id"] == upstream_id.encode()
        seen.add(trace_id)
    assert len(seen) == 200


@pytest.mark.parametrize("tag", ["", "0a0b0c0d", "ffffffff"])
def test_handed_numbers_are_the_hex_ids_and_the_client_trace_is_read_later(tag: str) -> None:
    propagate.set_owner_tag(tag)
    trace_id, span_id, trace_number, span_number, upstream_id = propagate.propagate_context(
        {"headers": []}, {}
    )
    assert upstream_id is not None and upstream_id.startswith(tag[:8])
    assert trace_id.startswith(tag) and trace_number == int(trace_id, 16)
    assert span_number == int(span_id, 16)
    client = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    handed = propagate.propagate_context({"headers": []}, {"traceparent": client})
    assert handed[0] == "ab" * 16 and handed[2] is None  # the client's: parsed by the span
    sent_own = propagate.propagate_context({"headers": []}, {"x-request-id": "client-7"})
    assert sent_own[4] is None  # the client's X-Request-Id goes up as it is
