"""Put an engine span's phases and counts on the request's timeline before it is reported."""

from __future__ import annotations

from middleware.request.timeline import RequestTimeline
from middleware.upstream import SpanPhases, UpstreamReport


def apply_engine_span(timeline: RequestTimeline, span: SpanPhases) -> None:
    """The engine's queue, prefill and decode replace what the wire could only tell as
    `queue_prefill`; its counts fill what the wire did not say exactly (usage stays first).

    With all three phases the span covers the engine's whole part of the request
    (`UpstreamReport.from_span`); with fewer (vLLM without `--collect-detailed-traces` gives
    the queue only) they are carved out of the time before the first token as headers are.
    Timelines the engine marked itself (the bundled engine's hooks) are left as they are.
    """
    if timeline.engine_reported:
        return
    report = timeline.upstream or timeline.take_upstream(UpstreamReport())
    if span.queue_s is not None:
        report.queue_s = span.queue_s
    if span.prefill_s is not None:
        report.prefill_s = span.prefill_s
    if span.decode_s is not None:
        report.decode_s = span.decode_s
    report.from_span = None not in (span.queue_s, span.prefill_s, span.decode_s)
    if span.output_tokens is not None and report.tokens_source != "usage":
        report.output_tokens = span.output_tokens
        report.tokens_source = "usage"
    if span.input_tokens is not None and report.input_tokens is None:
        report.input_tokens = span.input_tokens
    timeline.take_counts(span.input_tokens, None)
