"""The ids `slo proxy` and the mounted middleware hand the engine: the X-Request-Id is the
version-4 UUID `uuid` itself would write for our request id (formatted by hand for speed),
the same every time it is asked; the traceparent's ids are well-formed and never all zero."""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from middleware.intake import propagate


@pytest.fixture(autouse=True)
def no_tag() -> Iterator[None]:
    yield
    propagate.set_owner_tag("")


@given(st.text(min_size=1, max_size=40), st.sampled_from(["", "0a0b0c0d", "ffffffff"]))
def test_upstream_request_id_is_the_uuid_the_uuid_module_writes(request_id: str, tag: str) -> None:
    propagate.set_owner_tag(tag)
    digest = hashlib.md5(request_id.encode(), usedforsecurity=False).digest()
    raw = bytes.fromhex(tag)
    expected = str(uuid.UUID(bytes=raw + digest[len(raw) :], version=4))
    assert propagate.upstream_request_id(request_id) == expected
    assert propagate.upstream_request_id(request_id) == expected  # asked again: the same
    assert uuid.UUID(expected).version == 4 and expected.startswith(tag[:8])


def test_minted_traceparent_ids_are_well_formed_and_distinct() -> None:
    seen = set()
    for index in range(200):
        scope = {"headers": [(b"traceparent", b"garbage")]}
        trace_id, span_id, trace_number, span_number = propagate.propagate_context(
            scope, {}, f"req-{index}"
        )
        assert (trace_number, span_number) == (int(trace_id, 16), int(span_id, 16))
        assert re.fullmatch(r"[0-9a-f]{32}", trace_id) and trace_id != "0" * 32
        assert re.fullmatch(r"[0-9a-f]{16}", span_id) and span_id != "0" * 16
        sent = dict(scope["headers"])
        assert sent[b"traceparent"] == f"00-{trace_id}-{span_id}-01".encode()
        assert sent[b"x-request-id"] == propagate.upstream_request_id(f"req-{index}").encode()
        seen.add(trace_id)
    assert len(seen) == 200


@pytest.mark.parametrize("tag", ["", "0a0b0c0d", "ffffffff"])
def test_handed_numbers_are_the_hex_ids_and_the_client_trace_is_read_later(tag: str) -> None:
    propagate.set_owner_tag(tag)
    trace_id, span_id, trace_number, span_number = propagate.propagate_context(
        {"headers": []}, {}, "req-1"
    )
    assert trace_id.startswith(tag) and trace_number == int(trace_id, 16)
    assert span_number == int(span_id, 16)
    client = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    handed = propagate.propagate_context({"headers": []}, {"traceparent": client}, "req-2")
    assert handed[0] == "ab" * 16 and handed[2] is None  # the client's: parsed by the span
