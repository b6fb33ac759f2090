"""The app `slo proxy` serves, built from its flags: the forwarding app (with the upstream's
TLS context), the latency middleware in front, the engine-metrics reader; the same in one
process and in each worker of `--workers N` (slo.cli.proxy.workers)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slo.cli.security import guard_operations, limit_addresses, scheme
from slo.errors import UsageError

if TYPE_CHECKING:
    import ssl

    from middleware.core import LatencyMiddleware
    from middleware.metrics.metric_set import MetricSet
    from middleware.proxy import ProxyApp
    from middleware.types import ASGIApp
    from middleware.upstream.engine_metrics import EngineMetricsScraper

# How long a finished request's report waits, so a request that starts as it ends goes first
# (one millisecond: past the next request's start, well inside any scrape or page refresh).
REPORT_DELAY_S = 0.001


@dataclass
class Built:
    """The proxy's whole ASGI app, its middleware, and what to call on the way out."""

    app: ASGIApp
    middleware: LatencyMiddleware
    close: Callable[[], None]
    listing: tuple[str, list[str]]  # (provider name, models the upstream lists)


def build(
    args: argparse.Namespace,
    context: ssl.SSLContext | None,
    token: str | None,
    *,
    listing: tuple[str, list[str]] | None = None,
    scrape: bool = True,
    worker: bool = False,
) -> Built:
    """The app `slo proxy` serves, from its flags; `listing`: the upstream's, already read
    (a worker takes its parent's), `scrape`: read the engine's /metrics (one worker does),
    `worker`: one of `--workers N`, sharing the OTLP/gRPC port with the others."""
    proxy = _proxy_app(args)
    scrape_url = _metrics_url(args.upstream_metrics, proxy.upstream_url)
    model: str = args.model
    if listing is None:
        listing = _provider_and_models(args.provider_name, proxy.upstream_url, proxy.pool.tls)
    provider_name, listed = listing
    gpu_stats = _gpu_telemetry(args.gpu)
    with _grpc_errors_as_usage():
        middleware = _middleware(args, proxy, model, listing, gpu_stats, (token, worker))
    where = f"{scheme(context)}://{args.host}:{args.port}"
    print(f"proxying {where} -> {proxy.upstream_url} (model {model})")
    if middleware.otlp_grpc is not None:
        tls = " over TLS" if middleware.otlp_grpc.tls else ""
        print(f"OTLP/gRPC span intake: {middleware.otlp_grpc.address}{tls}")
        if token is None:
            print(
                f"warning: the OTLP/gRPC intake on {middleware.otlp_grpc.address} takes spans "
                "from anyone who can reach it; protect it with --ops-token-file",
                file=sys.stderr,
            )
    scraper = None
    if scrape:
        scraper = _start_scraper(
            scrape_url, args.upstream_metrics_interval, middleware.metrics, proxy.pool.tls
        )

    def close() -> None:
        if scraper is not None:  # first: nothing sets a gauge while the records are flushed
            scraper.stop()
        middleware.close()

    app = guard_operations(middleware, middleware, token)
    return Built(app, middleware, close, (provider_name, list(listed)))


def _middleware(
    args: argparse.Namespace,
    proxy: ProxyApp,
    model: str,
    listing: tuple[str, list[str]],
    gpu_stats: Callable[[], Any] | None,
    access: tuple[str | None, bool],
) -> LatencyMiddleware:
    from slo.cli.common.middleware import build_middleware

    provider_name, listed = listing
    return build_middleware(
        limit_addresses(proxy, args),
        args,
        model=model,
        propagate_trace=True,  # the engine's span then lands in our trace, found by its id
        provider_name=provider_name,
        models=listed,
        # A sidecar's clients often send the next request as the last one ends: its start
        # goes first, the last one's report a moment later (`middleware.request.later`).
        report_delay_s=REPORT_DELAY_S,
        gpu_stats=gpu_stats,
        **_grpc_access(args, *access),
    )


@contextlib.contextmanager
def _grpc_errors_as_usage() -> Iterator[None]:
    """--otlp-grpc's mistakes (its address, its port taken, grpcio missing) as one line."""
    from middleware.config import ConfigError
    from middleware.intake.grpc_server import GRPC_MISSING

    try:
        yield
    except (ConfigError, OSError, RuntimeError) as error:
        ours = (
            error.field.startswith("engine_spans.otlp_grpc")
            if isinstance(error, ConfigError)
            else str(error) == GRPC_MISSING or str(error).startswith("OTLP/gRPC intake")
        )
        if not ours:
            raise
        raise UsageError(f"--otlp-grpc: {error}") from None


def _grpc_access(
    args: argparse.Namespace, token: str | None, worker: bool = False
) -> dict[str, Any]:
    """The OTLP/gRPC intake's token and TLS: the proxy's own (`--ops-token-file`, `--ssl-*`);
    a worker of `--workers N` shares the port with the others."""
    if getattr(args, "otlp_grpc", None) is None:
        return {}
    return {
        "otlp_grpc_token": token,
        "otlp_grpc_certfile": args.ssl_certfile,
        "otlp_grpc_keyfile": args.ssl_keyfile,
        "otlp_grpc_ca_certs": args.ssl_ca_certs,
        "otlp_grpc_shared": worker,
    }


def _gpu_telemetry(wanted: bool) -> Callable[[], Any] | None:
    """`--gpu`: a read of the node's GPUs through NVML at each scrape, as `slo serve` has
    (`engine.gpu`; NVML is initialised at the first scrape, in the process that serves it)."""
    if not wanted:
        return None
    from engine.gpu import GpuTelemetry, load_pynvml

    nvml = load_pynvml()
    if nvml is None:
        raise UsageError(
            "--gpu reads the GPUs through NVML's Python bindings (the pynvml module), which "
            "are not installed; pip install nvidia-ml-py (or llm-slo[engine]), or leave out --gpu"
        )
    print("GPU telemetry: NVML, read at each scrape of /metrics")
    return GpuTelemetry(nvml).read


def _proxy_app(args: argparse.Namespace) -> ProxyApp:
    """The forwarding app, reaching an https:// upstream with its own TLS context."""
    upstream_tls = _upstream_context(args)
    from middleware.proxy import ProxyApp

    try:
        proxy = ProxyApp(
            args.upstream,
            max_connections=args.max_connections,
            connect_timeout_s=args.connect_timeout,
            read_timeout_s=args.read_timeout,
        )
    except ValueError as error:
        raise UsageError(f"--upstream: {error}") from error
    if upstream_tls is not None:
        proxy.pool.use_tls(upstream_tls)
    return proxy


def _upstream_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The context for an https:// upstream; TLS flags with an http:// one are a mistake."""
    from slo.cli.tls import client_context

    given = [
        flag
        for flag, value in (
            ("--upstream-ca-certs", args.upstream_ca_certs),
            ("--upstream-certfile", args.upstream_certfile),
            ("--upstream-keyfile", args.upstream_keyfile),
            ("--upstream-insecure", args.upstream_insecure),
        )
        if value
    ]
    upstream: str = args.upstream
    if not upstream.lower().startswith("https://"):
        if given:
            raise UsageError(f"{given[0]} needs an https:// --upstream, got {upstream}")
        return None
    if args.upstream_insecure:
        print(
            f"warning: --upstream-insecure: the certificate of {upstream} is not verified; "
            "anyone on the path can read and change the traffic",
            file=sys.stderr,
        )
    return client_context(
        ca_certs=args.upstream_ca_certs,
        certfile=args.upstream_certfile,
        keyfile=args.upstream_keyfile,
        insecure=args.upstream_insecure,
    )


def _provider_and_models(
    choice: str, upstream_url: str, tls: ssl.SSLContext | None
) -> tuple[str, list[str]]:
    """gen_ai.provider.name (`auto`: from the upstream's /v1/models) and the models it lists
    (allowed as model labels; more are learned as clients list them through the proxy)."""
    from middleware.otel import fetch_listing, provider_for_owner

    listed, owner = fetch_listing(upstream_url, context=tls)
    return (provider_for_owner(owner) if choice == "auto" else choice), listed


def _metrics_url(choice: str, upstream_url: str) -> str | None:
    from middleware.upstream.engine_metrics import metrics_url

    try:
        return metrics_url(choice, upstream_url)
    except ValueError as error:
        raise UsageError(f"--upstream-metrics: {error}") from error


def _start_scraper(
    url: str | None, interval_s: float, metrics: MetricSet, tls: ssl.SSLContext | None
) -> EngineMetricsScraper | None:
    """Read the engine's /metrics into `metrics` on a thread of its own (None when off), over
    the upstream's TLS context when it is https://."""
    if url is None:
        return None
    from middleware.upstream.engine_metrics import EngineMetricsScraper

    verify = tls if tls is not None else True
    scraper = EngineMetricsScraper(
        url, metrics.set_engine_gauges, interval_s=interval_s, verify=verify
    )
    print(f"engine metrics: {url} every {interval_s:g} s")
    scraper.start()
    return scraper
