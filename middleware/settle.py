"""`Reporter`: a finished request reported everywhere, once: span, metrics, live windows,
record; after a bounded wait for the engine's own span when one is expected
(`middleware.intake.join`)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from middleware.capture import CaptureBuffer, ContentCapture
from middleware.exchange import Exchange
from middleware.histograms import bucket_counts
from middleware.intake import SpanJoin, apply_engine_span
from middleware.intake.propagate import HandedIds
from middleware.live import LiveSLO
from middleware.metrics import MetricSet
from middleware.reporting import classify_outcome, record_fields, span_attributes
from middleware.tracing import RequestTracer
from middleware.upstream import SpanPhases
from slo.store import RecordStore

logger = logging.getLogger("middleware")


@dataclass(slots=True)
class Finished:
    """One request, as the middleware saw it end."""

    exchange: Exchange
    tier: str
    route: str
    headers: dict[str, str]
    outcome: str
    status: int
    # The ids of our request span, already handed to the app in `traceparent`.
    ids: HandedIds | None
    captured: CaptureBuffer | None = None  # the bodies, when content capture is on


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
    ) -> None:
        self.model = model
        self.metrics = metrics
        self.live = live
        self.store = store
        self.tracer = tracer
        self.span_join = span_join
        self.capture = capture
        self.epoch_offset_ns = epoch_offset_ns  # perf_counter_ns -> unix ns, for spans
        self.requests_seen = 0
        # One timer for all the waits: they end in the order they began (one wait length), so
        # the next to end is always the oldest. A timer per request would re-arm itself after
        # each firing while others wait, and the timers would pile up with the traffic.
        self._expiry: asyncio.TimerHandle | None = None

    def ended(
        self,
        exchange: Exchange,
        state: dict[str, Any],
        tier: str,
        route: str,
        headers: dict[str, str],
        raised: bool,
        ids: HandedIds | None,
        join_keys: tuple[str, str | None] | None,
    ) -> None:
        """A request ended (its app returned or raised): settle it, report it (`finish`), and
        charge its tokens to its API key. Called at once, or a moment later
        (`middleware.later`); `state` is the request's scope state, read now."""
        if join_keys is not None:
            self.span_join.end(*join_keys)
        try:
            exchange.settle()
            output_tokens = self.finish(
                exchange,
                state.get("tier", tier),  # the API key's layer may have decided it
                route,
                headers,
                state.get("outcome"),
                raised,
                ids,
                state.get("capture"),
                join_keys,
            )
            charge_tokens = state.get("charge_tokens")
            if charge_tokens is not None:  # the key's tokens-per-minute bucket
                charge_tokens(exchange.timeline.input_tokens + output_tokens)
        except Exception:  # reporting must never break the response
            logger.exception("llm-slo: failed to report request %s", exchange.timeline.request_id)

    def finish(
        self,
        exchange: Exchange,
        tier: str,
        route: str,
        headers: dict[str, str],
        hint: str | None,
        raised: bool,
        ids: HandedIds | None,
        captured: CaptureBuffer | None = None,
        join_keys: tuple[str, str | None] | None = None,
    ) -> int:
        """Settle one request: reported now, or once the engine's span comes (a bounded
        wait; `join_keys` as `join_keys` gave them, None where no span can come); the output
        tokens it produced."""
        self.requests_seen += 1
        outcome = classify_outcome(
            exchange.status,
            exchange.disconnected,
            exchange.complete or exchange.delivered,
            hint,
            raised and not exchange.delivered,
        )
        status = 500 if raised and not exchange.started else exchange.status
        finished = Finished(exchange, tier, route, headers, outcome, status, ids, captured)
        timeline = exchange.timeline
        if (
            outcome != "ok"
            or timeline.engine_reported
            or join_keys is None
            or not self.span_join.may_wait()
        ):
            # No engine span comes (no engine ran), none could find this request, or none is
            # held or waited for: `settle` would report it at once.
            produced = self.report(finished, None)
            return produced if status < 400 else 0
        trace_key, upstream_id = join_keys
        reported: list[int] = []  # the report's own count, when it goes out at once
        wait_s = self.span_join.settle(
            trace_key, upstream_id, lambda span: reported.append(self.report(finished, span))
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

    def report(self, finished: Finished, span: SpanPhases | None) -> int:
        """Report one finished request everywhere: span, metrics, live windows, record; the
        output tokens its breakdown counts."""
        exchange = finished.exchange
        timeline = exchange.timeline
        if span is not None:
            apply_engine_span(timeline, span)
        breakdown = timeline.breakdown()
        status, outcome, tier, route = (
            finished.status,
            finished.outcome,
            finished.tier,
            finished.route,
        )
        produced = status < 400 and breakdown.output_tokens > 0
        # Latency histograms (and the live windows on the same buckets) count ok requests only,
        # as `slo check` and the generated rules do; the record keeps what was produced.
        observed = breakdown if produced and outcome == "ok" else None
        ids, tracer = finished.ids, self.tracer
        trace_id = ids[0] if ids is not None else tracer.trace_id_from_header(finished.headers)
        if tracer.wants_requests:  # spans or gen_ai metrics: the request's GenAI view
            trace_id = self._emit_span(finished, breakdown, trace_id)
        # The gaps are counted on the itl buckets once, for the histogram and the live windows
        # (both bucket on the catalog's itl bounds plus the spec's thresholds).
        itl_counts = (
            bucket_counts(self.live.itl_bounds, observed.itl_s)
            if observed is not None and observed.itl_s
            else None
        )
        self.metrics.observe(
            tier, route, outcome, observed, timeline.input_tokens, trace_id, itl_counts
        )
        self.live.observe(tier, outcome, observed, itl_counts)
        if self.store is not None:
            fields = record_fields(
                timeline,
                breakdown,
                tier,
                self.model,
                route,
                outcome,
                status,
                exchange.is_stream,
                trace_id,
                produced,
            )
            self.store.add(fields)
        return breakdown.output_tokens

    def _emit_span(self, finished: Finished, breakdown: Any, trace_id: str | None) -> str | None:
        """The request's GenAI-convention telemetry: its `gen_ai.*` metrics and, when tracing
        is on, its span (named `{operation} {model}`); the request's trace id (`trace_id`,
        the one it came with or was given, unless the span was given another)."""
        ids, headers, tracer = finished.ids, finished.headers, self.tracer
        exchange = finished.exchange
        timeline = exchange.timeline
        request = tracer.genai_request(finished.route, finished.outcome, exchange)
        output_tokens = breakdown.output_tokens if finished.status < 400 else 0
        if tracer.genai is not None:
            tracer.genai.observe(request, breakdown, timeline.input_tokens, output_tokens)
        if not tracer.enabled:
            return trace_id
        attributes = span_attributes(
            request, finished.route, finished.tier, finished.status, timeline, breakdown,
            finished.outcome, output_tokens,
        )  # fmt: skip
        captured = finished.captured
        if captured is not None and self.capture is not None:
            attributes.update(self.capture.span_attributes(captured))
        emitted = tracer.emit(
            timeline,
            breakdown,
            attributes,
            tracer.parent_context(headers),
            request.span_name,
            self.epoch_offset_ns,
            ids,
        )
        return emitted or trace_id
