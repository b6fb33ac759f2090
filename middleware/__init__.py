"""Pure ASGI middleware: per-request latency breakdown, spans, Prometheus metrics, records and
live SLOs for LLM serving. Never imports torch or the bundled engine.
"""

from middleware.clock import Clock, ScriptedClock, SystemClock
from middleware.config import (
    ConfigError,
    EngineSpansConfig,
    MiddlewareConfig,
    ReportingConfig,
    RoutesConfig,
    SecurityConfig,
    TelemetryConfig,
)
from middleware.core import LatencyMiddleware
from middleware.request.bridge import EngineBridge
from middleware.request.context import current_timeline
from middleware.request.timeline import Breakdown, RequestTimeline

__all__ = [
    "Breakdown",
    "Clock",
    "ConfigError",
    "EngineBridge",
    "EngineSpansConfig",
    "LatencyMiddleware",
    "MiddlewareConfig",
    "ReportingConfig",
    "RequestTimeline",
    "RoutesConfig",
    "ScriptedClock",
    "SecurityConfig",
    "SystemClock",
    "TelemetryConfig",
    "current_timeline",
]
