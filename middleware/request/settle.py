"""`Reporter`: a finished request reported everywhere, once: span, metrics, live windows,
record; after a bounded wait for the engine's own span when one is expected
(`middleware.intake.join`)."""

from __future__ import annotations

import asyncio
import logging

from middleware.capture import ContentCapture
from middleware.intake import SpanJoin, apply_engine_span
from middleware.intake.propagate import HandedIds
from middleware.live import LiveSLO
from middleware.metrics.histograms import bucket_counts
from middleware.metrics.metric_set import MetricSet
from middleware.request.estimated_blame import BlameEstimator
from middleware.request.measured import MeasuredRequest
from middleware.request.reporting import record_fields, span_attributes
from middleware.request.timeline import Breakdown
from middleware.tracing import RequestTracer
from middleware.upstream import SpanPhases
from slo.store import RecordStore

logger = logging.getLogger("middleware")


class Reporter:
    def __init__(
        self,
        *,
        model: str,
        metrics: MetricSet,
        live: LiveSLO,
        store: RecordStore | None,
        tracer: RequestTracer,
        span_join: SpanJoin,
        capture: ContentCapture | None,
        epoch_offset_ns: int,
        estimator: BlameEstimator | None = None,
    ) -> None:
        self.model = model
        self.metrics = metrics
        self.live = live
        self.store = store
        self.tracer = tracer
        self.span_join = span_join
        self.capture = capture
        self.epoch_offset_ns = epoch_offset_ns  # perf_counter_ns -> unix ns, for spans
        self.estimator = estimator  # who made each request wait, where the engine says not
        self.requests_seen = 0
        # One timer for all the waits: they end in the order they began (one wait length), so
        # the next to end is always the oldest. A timer per request would re-arm itself after
        # each firing while others wait, and the timers would pile up with the traffic.
        self._expiry: asyncio.TimerHandle | None = None

    def ended(self, request: MeasuredRequest) -> None:
        """A request ended (its app returned or raised): settle it, report it (`finish`), and
        charge its tokens to its API key. Called at once, or a moment later
        (`middleware.request.later`): its scope state is read now."""
        if request.join_keys is not None:
            self.span_join.end(*request.join_keys)
        try:
            request.settle()
            output_tokens = self.finish(request)
            charge_tokens = request.state.get("charge_tokens")
            if charge_tokens is not None:  # the key's tokens-per-minute bucket
                charge_tokens(request.input_tokens + output_tokens)
        except Exception:  # reporting must never break the response
            logger.exception("llm-slo: failed to report request %s", request.timeline.request_id)

    def finish(self, request: MeasuredRequest) -> int:
        """Report one settled request: now, or once the engine's span comes (a bounded wait;
        none where no span can find it); the output tokens it produced."""
        self.requests_seen += 1
        status, timeline, join_keys = request.status, request.timeline, request.join_keys
        if (
            request.outcome != "ok"
            or timeline.engine_reported
            or join_keys is None
            or not self.span_join.may_wait()
        ):
            # No engine span comes (no engine ran), none could find this request, or none is
            # held or waited for: `settle` would report it at once.
            produced = self.report(request, None)
            return produced if status < 400 else 0
        trace_key, upstream_id = join_keys
        reported: list[int] = []  # the report's own count, when it goes out at once
        wait_s = self.span_join.settle(
            trace_key, upstream_id, lambda span: reported.append(self.report(request, span))
        )
        if wait_s is not None and self._expiry is None:
            self._expiry = asyncio.get_running_loop().call_later(wait_s, self._expire_waits)
        if status >= 400:
            return 0
        # Waiting for its span: the count the wire gave (one breakdown, on this rare path).
        return reported[0] if reported else timeline.breakdown().output_tokens

    def join_keys(
        self, request_id: str, headers: dict[str, str], ids: HandedIds | None
    ) -> tuple[str, str | None] | None:
        """The keys the engine's span finds this request by: its trace id (or, with none, a
        key of its own), and the request id the engine was sent. None when no engine span
        can find it: no span reaches this process (no intake, no relay), or the request has
        neither a trace id nor a request id the engine knows (nothing to join on; the
        request skips the join's bookkeeping, the common case with tracing off)."""
        join = self.span_join
        if not join.intake and join.relay is None:
            return None
        trace_id = ids[0] if ids is not None else self.tracer.trace_id_from_header(headers)
        upstream_id = headers.get("x-request-id") or (ids[4] if ids is not None else None)
        if trace_id is None and not upstream_id:
            return None
        return trace_id or f"request:{request_id}", upstream_id

    def _expire_waits(self) -> None:
        """Report the requests whose wait for an engine span is over; a timer that fired
        early is set again for what is left."""
        left_s = self.span_join.expire()
        self._expiry = None
        if left_s is not None:
            loop = asyncio.get_running_loop()
            self._expiry = loop.call_later(left_s + 0.001, self._expire_waits)

    def report(self, request: MeasuredRequest, span: SpanPhases | None) -> int:
        """Report one finished request everywhere: span, metrics, live windows, record; the
        output tokens its breakdown counts."""
        timeline = request.timeline
        if span is not None:
            apply_engine_span(timeline, span)
        breakdown = timeline.breakdown()
        outcome = request.outcome
        produced = request.status < 400 and breakdown.output_tokens > 0
        if self.estimator is not None:
            self._estimate_blame(request, breakdown, produced and outcome == "ok")
        # Latency histograms (and the live windows on the same buckets) count ok requests only,
        # as `slo check` and the generated rules do; the record keeps what was produced.
        observed = breakdown if produced and outcome == "ok" else None
        ids, tracer = request.ids, self.tracer
        trace_id = ids[0] if ids is not None else tracer.trace_id_from_header(request.headers)
        if tracer.wants_requests:  # spans or gen_ai metrics: the request's GenAI view
            trace_id = self._emit_span(request, breakdown, trace_id)
        # The gaps are counted on the itl buckets once, for the histogram and the live windows
        # (both bucket on the catalog's itl bounds plus the spec's thresholds).
        itl_counts = (
            bucket_counts(self.live.itl_bounds, observed.itl_s)
            if observed is not None and observed.itl_s
            else None
        )
        # Goodput is decided once, on what the record keeps, for the counter and /slo alike.
        good = self.metrics.goodput.good(request.tier, outcome, breakdown, produced)
        self.metrics.observe(request, observed, trace_id, itl_counts, good)
        self.live.observe(request.tier, outcome, observed, itl_counts, good)
        if self.store is not None:
            self.store.add(record_fields(request, breakdown, self.model, trace_id, produced))
        return breakdown.output_tokens

    def _estimate_blame(self, request: MeasuredRequest, breakdown: Breakdown, ok: bool) -> None:
        """The request's estimated blame, where the engine gave none (`estimated_blame`), on its
        timeline (record, span events) and the delay counters; it leaves the in-flight set."""
        timeline = request.timeline
        wanted = ok and timeline.delay_blame is None
        blame = self.estimator.estimate(timeline, breakdown, wanted)  # type: ignore[union-attr]
        if blame is not None:
            timeline.delay_blame = blame
            self.metrics.engine.observe_estimated(request.tier, blame)

    def _emit_span(
        self, request: MeasuredRequest, breakdown: Breakdown, trace_id: str | None
    ) -> str | None:
        """The request's GenAI-convention telemetry: its `gen_ai.*` metrics and, when tracing
        is on, its span (named `{operation} {model}`); the request's trace id (`trace_id`,
        the one it came with or was given, unless the span was given another)."""
        tracer, timeline = self.tracer, request.timeline
        genai_request = tracer.genai_request(request.route, request.outcome, request.exchange)
        output_tokens = breakdown.output_tokens if request.status < 400 else 0
        if tracer.genai is not None:
            tracer.genai.observe(genai_request, breakdown, timeline.input_tokens, output_tokens)
        if not tracer.enabled:
            return trace_id
        attributes = span_attributes(genai_request, request, breakdown, output_tokens)
        captured = request.captured
        if captured is not None and self.capture is not None:
            attributes.update(self.capture.span_attributes(captured))
        emitted = tracer.emit(
            timeline,
            breakdown,
            attributes,
            tracer.parent_context(request.headers),
            genai_request.span_name,
            self.epoch_offset_ns,
            request.ids,
        )
        return emitted or trace_id
