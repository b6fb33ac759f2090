"""The engine registry's header hook: headers come with the function that reads them, and an
adapter registered at any time is read from every response after it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest

from middleware.upstream import ADAPTERS, EngineAdapter, UpstreamReport, read_response_headers
from middleware.upstream.engines import ENGINE_MODULES
from middleware.upstream.registry import RESPONSE_HEADERS, register


def _queue_header(report: UpstreamReport, headers: Mapping[bytes, bytes]) -> bool:
    report.queue_s = int(headers[b"x-late-queue-ms"]) / 1000
    return True


@pytest.fixture
def late_adapter() -> Iterator[EngineAdapter]:
    adapter = register(
        EngineAdapter(
            name="late", headers=frozenset({b"x-late-queue-ms"}), read_headers=_queue_header
        )
    )
    try:
        yield adapter
    finally:
        del ADAPTERS["late"]
        RESPONSE_HEADERS.discard(b"x-late-queue-ms")


def test_every_engine_module_registers_at_import() -> None:
    assert {name.rsplit(".", 1)[1] for name in ENGINE_MODULES} <= set(ADAPTERS)


def test_headers_need_their_reader_and_lower_case() -> None:
    with pytest.raises(ValueError, match="read_headers"):
        EngineAdapter(name="x", headers=frozenset({b"x-a"}))
    with pytest.raises(ValueError, match="read_headers"):
        EngineAdapter(name="x", read_headers=_queue_header)
    with pytest.raises(ValueError, match="lower case"):
        EngineAdapter(name="x", headers=frozenset({b"X-A"}), read_headers=_queue_header)


def test_an_adapter_registered_later_is_read(late_adapter: EngineAdapter) -> None:
    assert b"x-late-queue-ms" in RESPONSE_HEADERS
    report = UpstreamReport()
    assert read_response_headers(report, {b"x-late-queue-ms": b"25"})
    assert report.queue_s == 0.025


def test_headers_no_adapter_reads_take_nothing() -> None:
    report = UpstreamReport()
    assert not read_response_headers(report, {b"x-compute-type": b"gpu"})
    assert report == UpstreamReport()
