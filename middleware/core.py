"""`LatencyMiddleware`: pure ASGI; splits every LLM request into phases and reports it everywhere.

    app = LatencyMiddleware(app, spec="slo.yaml", store="sqlite:///records.db")
    engine.add_hooks(app.engine_hooks())

Per request (state made inside `__call__`, never on `self`): a `RequestTimeline`, the tier
from the spec's match rules (its priority and a request id are handed to the app in
`scope["state"]`), and on the last byte sent: the breakdown, spans, Prometheus metrics, one
record to the store (off the request path) and the live SLO windows.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from middleware.auth import ApiKeyAuth
from middleware.bridge import EngineBridge
from middleware.capture import CaptureBuffer, ContentCapture
from middleware.clock import Clock, SystemClock
from middleware.histograms import bucket_counts
from middleware.intake import SpanJoin, apply_engine_span, serve_traces
from middleware.intake.propagate import propagate_context
from middleware.lifespan import Lifespan
from middleware.live import LiveSLO
from middleware.metrics import MetricSet
from middleware.reporting import (
    classify_outcome,
    record_fields,
    refusal,
    server_timing_value,
    span_attributes,
    timings_comment,
)
from middleware.timeline import (
    RequestTimeline,
    reset_current_timeline,
    set_current_timeline,
)
from middleware.tracing import DropCounter, RequestTracer
from middleware.types import ASGIApp, Message, Receive, Scope, Send
from middleware.wire import WireReader
from middleware.wire_io import (
    UPSTREAM_HEADERS,
    ask_for_usage,
    keep_body,
    read_upstream_headers,
    settle_body,
    settle_stream,
)
from slo.spec import SLOSpec
from slo.store import RecordStore

logger = logging.getLogger("middleware")

DEFAULT_LLM_ROUTES = ("/v1/completions", "/v1/chat/completions")
OTHER_ROUTE = "other"


class _Response:
    """What the app sent back for one request."""

    __slots__ = (
        "body",
        "complete",
        "delivered",
        "disconnected",
        "is_stream",
        "started",
        "status",
    )

    def __init__(self) -> None:
        self.status = 500
        self.started = False
        self.complete = False
        self.disconnected = False
        self.is_stream = False
        # The stream's `data: [DONE]` was handed to the server: the client has the whole answer
        # even if it closes before the response's last (empty) message (the openai client does).
        self.delivered = False
        self.body: bytearray | None = None


def _load_spec(spec: SLOSpec | str | Path | None) -> SLOSpec:
    if spec is None:
        return SLOSpec.default()
    if isinstance(spec, SLOSpec):
        return spec
    return SLOSpec.load(spec)


def _open_store(store: RecordStore | str | None) -> RecordStore | None:
    if store is None or isinstance(store, RecordStore):
        return store
    return RecordStore(store)


class LatencyMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        spec: SLOSpec | str | Path | None = None,
        store: RecordStore | str | None = "sqlite:///slo-records.db",
        *,
        model: str = "unknown",
        llm_routes: Iterable[str] = DEFAULT_LLM_ROUTES,
        metrics_path: str = "/metrics",
        slo_path: str = "/slo",
        clock: Clock | None = None,
        tracer_provider: Any | None = None,
        registry: Any | None = None,
        server_timing: bool = True,
        gpu_stats: Callable[[], Iterable[Any]] | None = None,
        alertmanager_url: str | None = None,
        auth: ApiKeyAuth | str | Path | None = None,
        capture: ContentCapture | None = None,
        inject_usage: bool = False,
        traces_path: str | None = "/v1/traces",
        engine_spans: Literal["auto", "always", "never"] = "auto",
        engine_span_wait_s: float = 10.0,
        propagate_trace: bool | None = None,
    ) -> None:
        self.app = app
        self.spec = _load_spec(spec)
        self.store = _open_store(store)
        self.model = model
        self.clock = clock or SystemClock()
        self.metrics_path = metrics_path
        self.slo_path = slo_path
        routes = set(llm_routes)
        for tier in self.spec.tiers:
            routes.update(r for r in tier.match.routes if not any(c in r for c in "*?["))
        self.llm_routes = frozenset(routes)
        self.server_timing = server_timing
        self.metrics = MetricSet(self.spec, model, registry, routes=self.llm_routes)
        self.span_drops = DropCounter()
        self.tracer = RequestTracer(tracer_provider, self.span_drops)
        self.bridge = EngineBridge(on_step=self.metrics.observe_engine_step)
        self.live = LiveSLO(self.spec, clock=self.clock, alertmanager_url=alertmanager_url)
        self.gpu_stats = gpu_stats
        if isinstance(auth, str | Path):
            auth = ApiKeyAuth.load(auth, {tier.name for tier in self.spec.tiers})
        self.auth = auth
        self.capture = capture
        # Ask streamed requests for `usage` (stream_options.include_usage) so counts are exact
        # on engines that report it; the usage chunk is kept from clients that did not ask.
        self.inject_usage = inject_usage
        # Engine request spans (OTLP at `traces_path`) joined to the records: see
        # middleware.intake.join for when a report waits for its span, and how long.
        self.traces_path = traces_path
        self.span_join = SpanJoin(engine_span_wait_s, expect=engine_spans)
        # Send the app (the engine, or `slo proxy`'s upstream) a traceparent of our request
        # span and an X-Request-Id; by default when our spans are exported (else the parent
        # would name a span no backend has), and always behind `slo proxy`.
        self.propagate_trace = self.tracer.enabled if propagate_trace is None else propagate_trace
        self.lifespan = Lifespan(self.close)
        self.requests_seen = 0
        # uuid4 reads the OS entropy pool per call (slow on some VMs): a random prefix per
        # middleware plus a counter is as unique and costs nothing.
        self._id_prefix = os.urandom(6).hex()
        self._ids = itertools.count(1)
        # perf_counter_ns -> unix ns, for spans; fixed once so every span agrees.
        self._epoch_offset_ns = time.time_ns() - time.perf_counter_ns()

    def engine_hooks(self) -> EngineBridge:
        """Hooks for the bundled engine (`engine.add_hooks(...)`) that fill request timelines."""
        return self.bridge

    def observe_cold_start(self, seconds: float) -> None:
        self.metrics.cold_start.labels(model=self.model).observe(seconds)

    def route_label(self, path: str) -> str | None:
        """The bounded route label of an LLM request, or None for requests not measured."""
        if path in self.llm_routes:
            return path
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self.lifespan.run(self.app, scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        self.lifespan.saw_request()
        path = scope.get("path", "")
        if path == self.metrics_path:
            await self._serve_metrics(scope, send)
            return
        if path == self.slo_path or path == self.slo_path + ".html":
            await self._serve_slo(path.endswith(".html"), scope, send)
            return
        if path == self.traces_path:
            await serve_traces(self.span_join, scope, receive, send)
            return
        route = self.route_label(path)
        if route is None:
            await self.app(scope, receive, send)
            return
        await self._measure(scope, receive, send, route)

    async def _measure(self, scope: Scope, receive: Receive, send: Send, route: str) -> None:
        clock = self.clock
        request_id = f"req-{self._id_prefix}{next(self._ids):x}"
        timeline = RequestTimeline.begin(request_id, clock)
        headers = {
            key.decode("latin-1").lower(): value.decode("latin-1")
            for key, value in scope.get("headers", ())
        }
        state = scope.setdefault("state", {})
        app = self.app
        key = None
        if self.auth is not None:
            decision = self.auth.check(headers, clock.wall_s())
            key = decision.key
            if key is not None:
                state["api_key_id"] = key.id
            if decision.status is not None:
                app = refusal(decision)
        if key is not None and key.tier is not None:
            tier = self.spec.tier(key.tier)
        else:
            tier = self.spec.resolve_tier(headers, route, state.get("api_key_id"))
        state["priority"] = tier.priority
        state["request_id"] = request_id
        state["tier"] = tier.name
        ids: tuple[str, str] | None = None
        if self.propagate_trace:
            ids = propagate_context(scope, headers, request_id)
        response = _Response()
        server_timing = self.server_timing
        now_ns = time.perf_counter_ns if isinstance(clock, SystemClock) else clock.now_ns
        captured = (
            CaptureBuffer(self.capture.max_chars * 4)
            if self.capture is not None and self.tracer.enabled
            else None
        )
        replay: list[Message] = []
        strip_usage = False
        if self.inject_usage and scope.get("method") == "POST":
            strip_usage = await ask_for_usage(scope, receive, replay)
            if replay and not replay[-1].get("more_body", False):
                timeline.body_received(clock.now_ns())
        wire = WireReader(strip_usage)
        feed = wire.feed
        token_events_in = wire.token_events_in

        async def receive_wrapper() -> Message:
            message = replay.pop(0) if replay else await receive()
            kind = message["type"]
            if kind == "http.request":
                if captured is not None:
                    captured.add_request(message.get("body", b""))
                if not message.get("more_body", False):
                    timeline.body_received(clock.now_ns())
            elif kind == "http.disconnect":
                response.disconnected = True
            return message

        chunk_sent = timeline.chunk_sent
        add_body_chunk = timeline.body_chunk_ns.append
        token_chunks = timeline.token_chunk_ns

        async def send_wrapper(message: Message) -> None:
            # The body branch runs once per streamed chunk: keep it to a few operations.
            if message["type"] == "http.response.body":
                started = now_ns()
                more = message.get("more_body", False)
                body = message.get("body")
                if more and body and response.is_stream:
                    # A chunk in the middle of a stream: the hot path, inlined.
                    add_body_chunk(started)
                    if strip_usage:
                        carried, sent = feed(body)
                        if sent is not body:
                            message = {**message, "body": sent}
                    else:
                        carried = token_events_in(body)
                    if carried:
                        if not token_chunks:
                            timeline.first_token_byte_ns = started
                        if carried == 1:
                            token_chunks.append(started)
                        else:  # events that arrived together: one mark each, gaps of 0
                            token_chunks.extend([started] * carried)
                    await send(message)
                    if not carried and wire.done and not response.delivered:
                        response.delivered = True
                        timeline.last_byte_ns = now_ns()  # unless a later message comes
                    if captured is not None:
                        captured.add_response(body)
                    return
                if response.is_stream:
                    if body:
                        carried, sent = feed(body)
                        if sent is not body:
                            message = {**message, "body": sent}
                        chunk_sent(started, carried)
                    if not more:
                        held = wire.flush()
                        if held:
                            message = {**message, "body": message.get("body", b"") + held}
                        settle_stream(timeline, wire)
                        if server_timing and response.status < 400:
                            comment = timings_comment(timeline.breakdown())
                            await send(
                                {"type": "http.response.body", "body": comment, "more_body": True}
                            )
                elif body:
                    # A plain reply's first piece carries its text (one token event).
                    chunk_sent(started, 0 if timeline.body_chunk_ns else 1)
                    keep_body(response, body)
                await send(message)
                if body and captured is not None:
                    captured.add_response(body)
                if not more:
                    timeline.last_byte_ns = now_ns()
                    response.complete = True
                return
            if message["type"] == "http.response.start":
                response.status = message["status"]
                response.started = True
                raw_headers = list(message.get("headers", ()))
                upstream_headers: dict[bytes, bytes] = {}
                for key, value in raw_headers:
                    name = key.lower()
                    if name == b"content-type":
                        if value.startswith(b"text/event-stream"):
                            response.is_stream = True
                            timeline.streamed = True
                        elif value.startswith(b"application/json"):
                            response.body = bytearray()
                    elif name in UPSTREAM_HEADERS:
                        upstream_headers[name] = value
                if upstream_headers:
                    read_upstream_headers(timeline, wire, upstream_headers)
                if server_timing and not response.is_stream:
                    raw_headers.append(
                        (b"server-timing", server_timing_value(timeline.breakdown()).encode())
                    )
                    message = {**message, "headers": raw_headers}
            await send(message)

        self.bridge.register(timeline)
        context_token = set_current_timeline(timeline)
        raised = False
        output_tokens = 0
        try:
            await app(scope, receive_wrapper, send_wrapper)
        except BaseException:
            raised = True
            raise
        finally:
            reset_current_timeline(context_token)
            self.bridge.unregister(timeline)
            try:
                if not response.is_stream:
                    settle_body(timeline, wire, response.body)
                elif not response.complete:  # the stream did not end: counts so far
                    settle_stream(timeline, wire)
                output_tokens = self._finish(
                    timeline, tier.name, route, headers, state, response, raised, captured, ids
                )
                if key is not None and self.auth is not None:
                    self.auth.charge_tokens(
                        key, timeline.input_tokens + output_tokens, clock.wall_s()
                    )
            except Exception:  # reporting must never break the response
                logger.exception("llm-slo: failed to report request %s", request_id)

    def _finish(
        self,
        timeline: RequestTimeline,
        tier: str,
        route: str,
        headers: dict[str, str],
        state: dict[str, Any],
        response: _Response,
        raised: bool,
        captured: CaptureBuffer | None = None,
        ids: tuple[str, str] | None = None,
    ) -> int:
        """Settle one finished request: reported now, or once the engine's span comes (a
        bounded wait, `middleware.intake.join`); the output tokens it produced."""
        self.requests_seen += 1
        outcome = classify_outcome(
            response.status,
            response.disconnected,
            response.complete or response.delivered,
            state.get("outcome"),
            raised and not response.delivered,
        )
        status = 500 if raised and not response.started else response.status
        trace_id = ids[0] if ids is not None else self.tracer.trace_id_from_header(headers)

        def report(span: Any) -> None:
            if span is not None:
                apply_engine_span(timeline, span)
            self._report(timeline, tier, route, headers, response, outcome, status, captured, ids)

        produced_tokens = timeline.breakdown().output_tokens if status < 400 else 0
        if outcome != "ok" or timeline.engine_reported:
            report(None)  # no engine span is coming for what never ran in a remote engine
        else:
            key = trace_id or f"request:{timeline.request_id}"
            upstream_id = headers.get("x-request-id") or (
                timeline.request_id if self.propagate_trace else None
            )
            wait_s = self.span_join.settle(key, upstream_id, report)
            if wait_s is not None:
                asyncio.get_running_loop().call_later(wait_s, self._expire_engine_spans)
        return produced_tokens

    def _expire_engine_spans(self) -> None:
        """Report the requests whose wait for an engine span is over; a timer that fired
        early is set again for what is left."""
        left_s = self.span_join.expire()
        if left_s is not None:
            asyncio.get_running_loop().call_later(left_s + 0.001, self._expire_engine_spans)

    def _report(
        self,
        timeline: RequestTimeline,
        tier: str,
        route: str,
        headers: dict[str, str],
        response: _Response,
        outcome: str,
        status: int,
        captured: CaptureBuffer | None,
        ids: tuple[str, str] | None,
    ) -> None:
        """Report one finished request everywhere: span, metrics, live windows, record."""
        breakdown = timeline.breakdown()
        produced = status < 400 and breakdown.output_tokens > 0
        # Latency histograms (and the live windows on the same buckets) count ok requests only,
        # as `slo check` and the generated rules do; the record keeps what was produced.
        observed = breakdown if produced and outcome == "ok" else None
        trace_id = ids[0] if ids is not None else self.tracer.trace_id_from_header(headers)
        if self.tracer.enabled:
            attributes = span_attributes(
                self.model, route, tier, status, response.is_stream, timeline, breakdown, outcome
            )
            if captured is not None and self.capture is not None:
                attributes["gen_ai.prompt"] = self.capture.text(captured.request)
                attributes["gen_ai.completion"] = self.capture.text(captured.response)
            trace_id = (
                self.tracer.emit(
                    timeline,
                    breakdown,
                    attributes,
                    self.tracer.parent_context(headers),
                    f"POST {route}",
                    self._epoch_offset_ns,
                    ids,
                )
                or trace_id
            )
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
            self.store.add(
                record_fields(
                    timeline,
                    breakdown,
                    tier,
                    self.model,
                    route,
                    outcome,
                    status,
                    response.is_stream,
                    trace_id,
                    produced,
                )
            )

    async def _serve_metrics(self, scope: Scope, send: Send) -> None:
        self.metrics.observe_losses(self.store, self.span_drops, self.span_join.counts)
        if self.gpu_stats is not None:
            self.metrics.observe_gpus(self.gpu_stats())
        accept = ""
        for key, value in scope.get("headers", ()):
            if key.lower() == b"accept":
                accept = value.decode("latin-1")
        body, content_type = self.metrics.exposition(accept)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", content_type.encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _serve_slo(self, as_html: bool, scope: Scope, send: Send) -> None:
        query = scope.get("query_string", b"").decode("latin-1")
        code, content_type, body = self.live.respond(as_html, query, self.metrics)
        await send(
            {
                "type": "http.response.start",
                "status": code,
                "headers": [(b"content-type", content_type.encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def close(self) -> None:
        """Flush records and stop background work (call on shutdown)."""
        self.span_join.close()  # reports still waiting for an engine span go out without it
        if self.store is not None:
            self.store.close()
        self.live.close()
