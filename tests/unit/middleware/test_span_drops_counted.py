"""Spans the batch processor has to drop (its queue full while the exporter is stuck) are
counted, one by one, never silent (middleware.tracing.counting_batch_processor)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import middleware.tracing as tracing


class StuckExporter(SpanExporter):
    """Holds its first export until released, so the processor's queue fills up."""

    def __init__(self) -> None:
        self.taken = threading.Event()
        self.release = threading.Event()
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.taken.set()
        self.release.wait(10)
        self.exported += len(spans)
        return SpanExportResult.SUCCESS


def test_each_span_dropped_at_a_full_queue_is_counted() -> None:
    drops = tracing.DropCounter()
    exporter = StuckExporter()
    processor = tracing.counting_batch_processor(exporter, drops, queue_size=8)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test")
    for index in range(8):  # the eighth wakes the exporter, which takes the batch and sticks
        tracer.start_span(f"taken {index}").end()
    exporter.taken.wait(10)
    for index in range(8):  # fills the queue again
        tracer.start_span(f"kept {index}").end()
    assert drops.dropped == 0
    for index in range(3):  # each finds the queue full
        tracer.start_span(f"over {index}").end()
    assert drops.dropped == 3
    exporter.release.set()
    provider.shutdown()
