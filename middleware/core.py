"""`LatencyMiddleware`: pure ASGI; splits every LLM request into phases and reports it everywhere.

    app = LatencyMiddleware(app, spec="slo.yaml", store="sqlite:///records.db")
    engine.add_hooks(app.engine_hooks())

Per request (state made inside `__call__`, never on `self`): a `RequestTimeline`, the tier
from the spec's match rules (its priority and a request id are handed to the app in
`scope["state"]`), and on the last byte sent: the breakdown, spans, Prometheus metrics, one
record to the store (off the request path) and the live SLO windows.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterable
from functools import partial
from pathlib import Path

from middleware.auth import ApiKeyAuth, ApiKeyMiddleware
from middleware.capture import CaptureMiddleware, ContentCapture
from middleware.clock import Clock, SystemClock
from middleware.config import (
    EngineSpansConfig,
    MiddlewareConfig,
    TelemetryConfig,
)
from middleware.endpoints import serve_metrics, serve_slo
from middleware.intake import SpanJoin, serve_traces
from middleware.intake.grpc_server import grpc_intake
from middleware.intake.propagate import propagate_context
from middleware.lifespan import Lifespan
from middleware.live import LiveSLO
from middleware.metrics.metric_set import MetricSet
from middleware.otel import GenAIMetrics, ModelLabels
from middleware.otel.models import MODELS_PATH, read_models_listing
from middleware.otel.request import operation_for_route
from middleware.otel.sdk import metrics_wanted
from middleware.request.arrival import start_at_first_byte
from middleware.request.bridge import EngineBridge
from middleware.request.context import reset_current_timeline, set_current_timeline
from middleware.request.estimated_blame import BlameEstimator
from middleware.request.exchange import Exchange
from middleware.request.exchange_direct import measured_direct_body
from middleware.request.later import Later
from middleware.request.measured import MeasuredRequest
from middleware.request.settle import Reporter
from middleware.request.state import request_state
from middleware.request.timeline import RequestTimeline
from middleware.tracing import DropCounter, RequestTracer
from middleware.types import ASGIApp, Message, Receive, Scope, Send
from middleware.wire.direct_body import direct_body, put_direct_body
from middleware.wire.io import ask_for_usage
from slo.spec import SLOSpec
from slo.store import RecordStore

OTHER_ROUTE = "other"


def _load_spec(spec: SLOSpec | str | Path | None) -> SLOSpec:
    if spec is None:
        return SLOSpec.default()
    if isinstance(spec, SLOSpec):
        return spec
    return SLOSpec.load(spec)


def _measured_routes(llm_routes: Iterable[str], spec: SLOSpec) -> frozenset[str]:
    """The LLM routes, plus the literal routes the spec's tiers match on."""
    routes = set(llm_routes)
    for tier in spec.tiers:
        routes.update(r for r in tier.match.routes if not any(c in r for c in "*?["))
    return frozenset(routes)


def _open_store(store: RecordStore | str | None) -> RecordStore | None:
    if store is None or isinstance(store, RecordStore):
        return store
    return RecordStore(store)


def _load_auth(auth: ApiKeyAuth | str | Path | None, spec: SLOSpec) -> ApiKeyAuth | None:
    """The API keys: as given, or read from a keys file checked against the spec's tiers."""
    if isinstance(auth, str | Path):
        return ApiKeyAuth.load(auth, {tier.name for tier in spec.tiers})
    return auth


class LatencyMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        spec: SLOSpec | str | Path | None = None,
        store: RecordStore | str | None = "sqlite:///slo-records.db",
        *,
        model: str = "unknown",
        config: MiddlewareConfig | None = None,
        clock: Clock | None = None,
    ) -> None:
        """`config`: routes, telemetry, engine spans, reporting and security
        (`middleware.config`); `clock`: where durations are read (a `ScriptedClock` in tests)."""
        self.config = config = config if config is not None else MiddlewareConfig()
        self.spec = _load_spec(spec)
        self.store = _open_store(store)
        self.model = model
        self.clock = clock or SystemClock()
        routes = config.routes
        self.metrics_path, self.slo_path = routes.metrics_path, routes.slo_path
        self.llm_routes = _measured_routes(routes.llm_routes, self.spec)
        self._set_up_telemetry(config.telemetry, config.reporting.alertmanager_url)
        self.auth = _load_auth(config.security.auth, self.spec)
        self.capture = config.security.capture
        self.app = self._stack(app, self.auth, self.capture)
        self._set_up_engine_spans(config.engine_spans, routes.traces_path)
        # Reports may wait a moment (`middleware.request.later`): whatever reads them runs them
        # first.
        self._later = Later(config.reporting.report_delay_s)
        self.lifespan = Lifespan(
            self.close, before_close=self._later.run_now, on_start=self._attach_intakes
        )
        self.estimator = BlameEstimator() if config.reporting.estimate_blame else None
        if self.estimator is not None:
            self.metrics.engine.bear_estimated()
        self.reporter = self._reporter()
        self._set_up_request_path(routes.traces_path)
        # Read per request: kept here, not looked up through the config each time.
        self._inject_usage = config.reporting.inject_usage
        self._server_timing = config.reporting.server_timing

    def _set_up_request_path(self, traces_path: str | None) -> None:
        """Request ids, and the routes measured without a lookup."""
        # uuid4 reads the OS entropy pool per call (slow on some VMs): a random prefix per
        # middleware plus a counter is as unique and costs nothing.
        self._id_prefix = os.urandom(6).hex()
        self._ids = itertools.count(1)
        # The LLM routes no endpoint of ours answers: a request there is measured at once.
        self._measured_paths = self.llm_routes - {
            self.metrics_path,
            self.slo_path,
            self.slo_path + ".html",
            traces_path,
            MODELS_PATH,
        }

    def _reporter(self) -> Reporter:
        """What settles each finished request: span, metrics, live windows, record."""
        return Reporter(
            model=self.model,
            metrics=self.metrics,
            live=self.live,
            store=self.store,
            tracer=self.tracer,
            span_join=self.span_join,
            capture=self.capture,
            estimator=self.estimator,
            # perf_counter_ns -> unix ns, for spans; fixed once so every span agrees.
            epoch_offset_ns=time.time_ns() - time.perf_counter_ns(),
        )

    def _set_up_telemetry(self, telemetry: TelemetryConfig, alertmanager_url: str | None) -> None:
        """Metrics, request spans, gen_ai.* metrics, engine-step bridge and live SLOs."""
        self.gpu_stats = telemetry.gpu_stats
        self.metrics = MetricSet(self.spec, self.model, telemetry.registry, routes=self.llm_routes)
        self.span_drops = DropCounter()
        # GenAI conventions (middleware.otel): model names become metric attributes only from
        # this allow-list (configured, or listed at /v1/models).
        model = self.model
        self.model_labels = ModelLabels(
            [*telemetry.models, *([model] if model != "unknown" else [])]
        )
        self.tracer = RequestTracer(
            telemetry.tracer_provider,
            self.span_drops,
            provider_name=telemetry.provider_name,
            labels=self.model_labels,
        )
        self.genai = self._genai_metrics(telemetry)
        self.tracer.genai = self.genai
        self.bridge = EngineBridge(
            on_step=self.metrics.observe_engine_step,
            on_blame=self.metrics.engine.observe_blame,
            tier_names={tier.priority: tier.name for tier in self.spec.tiers},
        )
        self.live = LiveSLO(self.spec, clock=self.clock, alertmanager_url=alertmanager_url)

    def _set_up_engine_spans(self, spans: EngineSpansConfig, traces_path: str | None) -> None:
        """Engine request spans (OTLP at `traces_path`) joined to the records: see
        middleware.intake.join for when a report waits for its span, and how long."""
        self.traces_path = traces_path
        intake = traces_path is not None or spans.otlp_grpc is not None
        self.span_join = SpanJoin(spans.wait_s, expect=spans.expect, intake=intake)
        # OTLP over gRPC on a port of its own, served from now on; its exports are taken on
        # the event loop, once lifespan (or the first request) gives it (`_attach_intakes`).
        self.otlp_grpc = None if spans.otlp_grpc is None else grpc_intake(self.span_join, spans)
        # Send the app (the engine, or `slo proxy`'s upstream) a traceparent of our request
        # span and an X-Request-Id; by default when our spans are exported (else the parent
        # would name a span no backend has), and always behind `slo proxy`.
        propagate = spans.propagate_trace
        self.propagate_trace = self.tracer.enabled if propagate is None else propagate

    def _attach_intakes(self) -> None:
        if self.otlp_grpc is not None:
            self.otlp_grpc.attach()

    def _genai_metrics(self, telemetry: TelemetryConfig) -> GenAIMetrics | None:
        """The gen_ai.* metrics on the SDK's MeterProvider (OTLP per OTEL_*) and on /metrics,
        beside the llm_slo_* series, when OpenTelemetry is on (`metrics_wanted`): off costs
        nothing."""
        readers = list(telemetry.metric_readers)
        meter_provider = telemetry.meter_provider
        if not metrics_wanted(
            telemetry.genai_metrics, self.tracer.enabled, meter_provider, readers
        ):
            return None
        return GenAIMetrics(
            provider=telemetry.provider_name,
            labels=self.model_labels,
            registry=self.metrics.registry,
            operations={operation_for_route(route) for route in self.llm_routes},
            multiprocess=self.metrics.multiprocess,
            meter_provider=meter_provider,
            metric_readers=readers,
        )

    def _stack(
        self, app: ASGIApp, auth: ApiKeyAuth | None, capture: ContentCapture | None
    ) -> ASGIApp:
        """The default stack: API keys, then content capture (only when spans are exported),
        each its own ASGI layer inside the measurement, so their answers are measured too."""
        if capture is not None and self.tracer.enabled:
            app = CaptureMiddleware(app, capture, self.llm_routes)
        if auth is not None:
            app = ApiKeyMiddleware(app, auth, self.spec, self.llm_routes, self.clock)
        return app

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
        if path in self._measured_paths:  # most requests
            await self._measure(scope, receive, send, path)
            return
        self._later.run_now()  # what follows reads the reports: none may wait
        if path == self.metrics_path:
            self.metrics.observe_losses(self.store, self.span_drops, self.span_join.counts)
            if self.gpu_stats is not None:
                self.metrics.observe_gpus(self.gpu_stats())
            await serve_metrics(self.metrics, scope, send)
            return
        if path == self.slo_path or path == self.slo_path + ".html":
            await serve_slo(self.live, self.metrics, path.endswith(".html"), scope, send)
            return
        if path == self.traces_path:
            await serve_traces(self.span_join, scope, receive, send)
            return
        if path == MODELS_PATH:  # the listed models become allowed model labels
            await read_models_listing(self.app, self.model_labels, scope, receive, send)
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
        start_at_first_byte(timeline, scope)
        headers = {
            key.decode("latin-1").lower(): value.decode("latin-1")
            for key, value in scope.get("headers", ())
        }
        state = request_state(scope)
        tier = self.spec.resolve_tier(headers, route, state.get("api_key_id"))
        state["priority"] = tier.priority
        state["request_id"] = request_id
        state["tier"] = tier.name
        ids = propagate_context(scope, headers) if self.propagate_trace else None
        join_keys = self.reporter.join_keys(request_id, headers, ids)
        if join_keys is not None:  # an engine span can find it, and may come before it ends
            self.span_join.begin(*join_keys)
        exchange = await self._exchange(scope, receive, send, timeline)
        below = direct_body(scope, send)  # the server writes stream pieces itself: measure them
        if below is not None:
            put_direct_body(scope, measured_direct_body(exchange, below))
        request = MeasuredRequest(
            exchange, timeline, state, tier.name, route, headers, ids, join_keys
        )
        self.bridge.register(timeline)
        if self.estimator is not None:
            self.estimator.begin(timeline, tier.name)
        context_token = set_current_timeline(timeline)
        try:
            await self.app(scope, exchange.receive, exchange.send)
        except BaseException:
            request.raised = True
            raise
        finally:
            reset_current_timeline(context_token)
            self.bridge.unregister(timeline)
            self._later.put(partial(self.reporter.ended, request))

    async def _exchange(
        self, scope: Scope, receive: Receive, send: Send, timeline: RequestTimeline
    ) -> Exchange:
        clock = self.clock
        replay: list[Message] = []
        strip_usage = False
        if self._inject_usage and scope.get("method") == "POST":
            strip_usage = await ask_for_usage(scope, receive, replay)
            if replay and not replay[-1].get("more_body", False):
                timeline.body_received(clock.now_ns())
        return Exchange(
            timeline,
            receive,
            send,
            time.perf_counter_ns if isinstance(clock, SystemClock) else clock.now_ns,
            replay=replay,
            strip_usage=strip_usage,
            server_timing=self._server_timing,
            keep_request=self.tracer.wants_requests,
            server=scope.get("server"),
        )

    @property
    def requests_seen(self) -> int:
        self._later.run_now()
        return self.reporter.requests_seen

    def close(self) -> None:
        """Flush records and stop background work (call on shutdown)."""
        if self.otlp_grpc is not None:
            self.otlp_grpc.close()  # first: no span comes in while the reports go out
        self._later.run_now()
        self.span_join.close()  # reports still waiting for an engine span go out without it
        if self.store is not None:
            self.store.close()
        self.live.close()
        if self.genai is not None:
            self.genai.close()  # the last OTLP export
