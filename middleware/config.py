"""`MiddlewareConfig`: everything `LatencyMiddleware` is told besides its app, spec, store and
model, as one frozen object of frozen parts, one part per component:

    config = MiddlewareConfig(
        routes=RoutesConfig(llm_routes=("/v1/chat/completions",)),
        reporting=ReportingConfig(inject_usage=True),
    )
    app = LatencyMiddleware(app, spec="slo.yaml", store="sqlite:///records.db", config=config)

or, naming the fields alone (each name belongs to exactly one part):

    config = MiddlewareConfig.of(inject_usage=True, engine_span_wait_s=5.0)

Each part is checked where it is made: a bad value raises `ConfigError`, naming the field
(`reporting.report_delay_s`), what it got and what it takes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from middleware.otel.conventions import FALLBACK_PROVIDER

if TYPE_CHECKING:
    from middleware.auth import ApiKeyAuth
    from middleware.capture import ContentCapture

DEFAULT_LLM_ROUTES = ("/v1/completions", "/v1/chat/completions")
ENGINE_SPAN_MODES = ("auto", "always", "never")


class ConfigError(ValueError):
    """A configuration value the middleware cannot use; `field` names it (`part.name`)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"MiddlewareConfig {field_name}: {message}")
        self.field = field_name


def _path(part: str, name: str, value: str | None, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value.startswith("/"):
        raise ConfigError(f"{part}.{name}", f"a path starting with '/', got {value!r}")


def _not_negative(part: str, name: str, value: float) -> None:
    if not value >= 0:  # NaN too
        raise ConfigError(f"{part}.{name}", f"seconds, 0 or more, got {value!r}")


@dataclass(frozen=True, slots=True)
class RoutesConfig:
    """Which paths are LLM requests (measured), and where our own endpoints answer."""

    # The routes measured (the spec's literal tier routes are added to them).
    llm_routes: tuple[str, ...] = DEFAULT_LLM_ROUTES
    metrics_path: str = "/metrics"  # Prometheus
    slo_path: str = "/slo"  # the live SLOs as JSON; the on-call page at `slo_path + ".html"`
    traces_path: str | None = "/v1/traces"  # the OTLP/HTTP span intake; None: no intake

    def __post_init__(self) -> None:
        object.__setattr__(self, "llm_routes", tuple(self.llm_routes))
        for route in self.llm_routes:
            _path("routes", "llm_routes", route)
        _path("routes", "metrics_path", self.metrics_path)
        _path("routes", "slo_path", self.slo_path)
        _path("routes", "traces_path", self.traces_path, optional=True)


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    """Spans, metrics and their names: OpenTelemetry and Prometheus."""

    tracer_provider: Any | None = None  # None: the global one, if OTEL_* configure it
    registry: Any | None = None  # a prometheus_client registry; None: the middleware's own
    meter_provider: Any | None = None  # for the gen_ai.* metrics over OTLP
    metric_readers: tuple[Any, ...] = ()  # readers of the gen_ai.* metrics (tests, exporters)
    genai_metrics: bool | None = None  # None: on when OpenTelemetry is on
    provider_name: str = FALLBACK_PROVIDER  # gen_ai.provider.name
    models: tuple[str, ...] = ()  # model names allowed as metric attributes
    # Read at each /metrics scrape: an `engine.gpu.GpuReading` (devices and NVML's failed
    # calls), or an iterable of devices.
    gpu_stats: Callable[[], Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "metric_readers", tuple(self.metric_readers))
        object.__setattr__(self, "models", tuple(self.models))
        if not isinstance(self.provider_name, str) or not self.provider_name:
            raise ConfigError(
                "telemetry.provider_name", f"a non-empty name, got {self.provider_name!r}"
            )


@dataclass(frozen=True, slots=True)
class EngineSpansConfig:
    """The engine's own request spans, joined to the records (`middleware.intake.join`)."""

    # auto: wait for a span once the engine has sent one; always; never.
    expect: Literal["auto", "always", "never"] = "auto"
    wait_s: float = 10.0  # how long a finished request waits for its span
    # Hand the app a traceparent of our request span; None: when our spans are exported.
    propagate_trace: bool | None = None
    # Also take OTLP over gRPC (the TraceService) on this HOST:PORT (`middleware.intake.
    # grpc_server`); None: OTLP/HTTP at routes.traces_path only.
    otlp_grpc: str | None = None
    otlp_grpc_token: str | None = None  # the operations token its exports must carry
    otlp_grpc_certfile: str | None = None  # PEM: serve it over TLS with this certificate
    otlp_grpc_keyfile: str | None = None  # its key (default: read from the certfile)
    otlp_grpc_ca_certs: str | None = None  # mutual TLS: clients' certificates signed by these
    # Several processes of one server listen on the port (SO_REUSEPORT; `slo proxy --workers`,
    # whose span relay hands each worker the spans of its requests); else it is one's alone.
    otlp_grpc_shared: bool = False

    def __post_init__(self) -> None:
        if self.expect not in ENGINE_SPAN_MODES:
            raise ConfigError(
                "engine_spans.expect", f"one of {', '.join(ENGINE_SPAN_MODES)}, got {self.expect!r}"
            )
        _not_negative("engine_spans", "wait_s", self.wait_s)
        if self.otlp_grpc is not None:
            _host_port("engine_spans", "otlp_grpc", self.otlp_grpc)
        if self.otlp_grpc_certfile is None:
            for name in ("otlp_grpc_keyfile", "otlp_grpc_ca_certs"):
                if getattr(self, name) is not None:
                    raise ConfigError(
                        f"engine_spans.{name}", "needs otlp_grpc_certfile: TLS needs a certificate"
                    )


def _host_port(part: str, name: str, value: str) -> None:
    host, _, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{part}.{name}", f"HOST:PORT, e.g. 127.0.0.1:4317, got {value!r}")


@dataclass(frozen=True, slots=True)
class ReportingConfig:
    """What each request tells its client and its server, and when."""

    server_timing: bool = True  # Server-Timing header and the final SSE timings comment
    # Ask streamed requests for usage (stream_options.include_usage) so token counts are exact
    # on engines that report it; clients that did not ask never see it.
    inject_usage: bool = False
    report_delay_s: float = (
        0.0  # report a moment after the request ends (`middleware.request.later`)
    )
    alertmanager_url: str | None = None  # where the live alerts are pushed
    # Estimate who made each request wait from what the middleware sees of all of them, where
    # the engine reports no blame (`middleware.request.estimated_blame`; `slo proxy`'s default).
    estimate_blame: bool = False

    def __post_init__(self) -> None:
        _not_negative("reporting", "report_delay_s", self.report_delay_s)


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """Who may call, and what of the content is kept."""

    auth: ApiKeyAuth | str | Path | None = None  # API keys, or a keys file to read
    capture: ContentCapture | None = None  # prompts and completions on spans (tracing on)


@dataclass(frozen=True, slots=True)
class MiddlewareConfig:
    routes: RoutesConfig = field(default_factory=RoutesConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    engine_spans: EngineSpansConfig = field(default_factory=EngineSpansConfig)
    reporting: ReportingConfig = field(default_factory=ReportingConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)

    @classmethod
    def of(cls, **fields: Any) -> MiddlewareConfig:
        """A config from its parts' field names alone: `MiddlewareConfig.of(inject_usage=True)`."""
        return cls().replace(**fields)

    def replace(self, **fields: Any) -> MiddlewareConfig:
        """A copy with these fields of its parts changed (each name is one part's field)."""
        changes: dict[str, dict[str, Any]] = {}
        for name, value in fields.items():
            part = FIELD_PARTS.get(name)
            if part is None:
                raise TypeError(
                    f"MiddlewareConfig has no field {name!r}; its fields: {', '.join(FIELD_PARTS)}"
                )
            changes.setdefault(part, {})[name] = value
        parts = {
            part: dataclasses.replace(getattr(self, part), **values)
            for part, values in changes.items()
        }
        return dataclasses.replace(self, **parts)


def _field_parts() -> dict[str, str]:
    """Each part's field name -> the part holding it; a name in two parts is refused."""
    parts: dict[str, str] = {}
    for part in dataclasses.fields(MiddlewareConfig):
        part_type = part.default_factory  # the part's class
        for name in (f.name for f in dataclasses.fields(part_type)):  # type: ignore[arg-type]
            if name in parts:
                raise AssertionError(f"{name!r} is a field of both {parts[name]} and {part.name}")
            parts[name] = part.name
    return parts


FIELD_PARTS = _field_parts()
