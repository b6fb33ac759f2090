"""The latency middleware of `slo serve`, `slo proxy` and `slo demo`, built from their flags in
one place: each flag below is one field of `middleware.MiddlewareConfig`, read where the
command has it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from middleware import LatencyMiddleware, MiddlewareConfig
    from middleware.types import ASGIApp

# argparse dest -> the MiddlewareConfig field it sets.
FLAG_FIELDS = {
    "alertmanager_url": "alertmanager_url",
    "api_keys": "auth",
    "provider_name": "provider_name",
    "inject_usage": "inject_usage",
    "estimate_blame": "estimate_blame",
    "engine_spans": "expect",
    "engine_span_wait": "wait_s",
    "otlp_grpc": "otlp_grpc",
}


def middleware_config(args: argparse.Namespace, **fields: Any) -> MiddlewareConfig:
    """The config the command's flags say, then `fields` (what the command decides itself)."""
    from middleware import MiddlewareConfig

    from_flags = {
        field: getattr(args, dest) for dest, field in FLAG_FIELDS.items() if hasattr(args, dest)
    }
    return MiddlewareConfig.of(**{**from_flags, **fields})


def build_middleware(
    app: ASGIApp,
    args: argparse.Namespace,
    *,
    model: str,
    spec: str | Path | None = None,
    store: str | None = None,
    **fields: Any,
) -> LatencyMiddleware:
    """The latency middleware around `app`: judged by `spec` (default: `--spec`), recording to
    `store` (default: `--store`), configured by the flags and `fields`."""
    from middleware import LatencyMiddleware

    return LatencyMiddleware(
        app,
        spec=spec if spec is not None else getattr(args, "spec", None),
        store=store if store is not None else args.store,
        model=model,
        config=middleware_config(args, **fields),
    )
