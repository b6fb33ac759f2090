"""Pure ASGI middleware: per-request latency breakdown, spans, Prometheus metrics, records and
live SLOs for LLM serving. Never imports torch or the bundled engine.
"""

from middleware.bridge import EngineBridge
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
from middleware.timeline import Breakdown, RequestTimeline, current_timeline

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
