"""`slo proxy`: the latency middleware in front of any OpenAI-compatible server (a sidecar)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slo.cli.security import (
    add_security_flags,
    guard_operations,
    limit_addresses,
    read_access,
    scheme,
)
from slo.cli.serving import add_server_flags, check_positive_seconds, run_until_stopped
from slo.errors import UsageError

if TYPE_CHECKING:
    import ssl

    from middleware.core import LatencyMiddleware
    from middleware.metrics import MetricSet
    from middleware.proxy import ProxyApp
    from middleware.types import ASGIApp
    from middleware.upstream.engine_metrics import EngineMetricsScraper

HELP = "measure any OpenAI-compatible server: a streaming reverse proxy with the middleware"
DESCRIPTION = (
    "Forward every request to --upstream (any OpenAI-compatible server, in any "
    "language) with the latency middleware in front: records, /metrics and /slo as with "
    "`slo serve`, no change to the engine. Run it beside the engine (a sidecar)."
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--upstream", required=True, help="the engine's base URL, e.g. http://127.0.0.1:8080"
    )
    add_server_flags(parser)
    parser.add_argument(
        "--workers",
        default="1",
        metavar="N|auto",
        help="serve from N processes on the one port, so the proxy uses N cores; records, "
        "/metrics and /slo count every worker's requests; auto: the CPUs this process may "
        "use. Set it to the pod's CPU limit (docs/proxy.md) (default: %(default)s)",
    )
    add_security_flags(parser)
    _add_upstream_tls_flags(parser)
    parser.add_argument(
        "--model",
        default="upstream",
        help="model label on metrics and records (default: %(default)s)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=256,
        help="most connections open to the upstream at once; more requests wait "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="give up reaching the upstream (or waiting for a free connection): 504 "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--read-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="give up when the upstream sends nothing for this long: 504 (default: %(default)s)",
    )
    parser.add_argument(
        "--inject-usage",
        action="store_true",
        help="ask streamed requests for usage (stream_options.include_usage) so token counts "
        "are exact on engines that report it; clients that did not ask never see it",
    )
    parser.add_argument(
        "--upstream-metrics",
        default="auto",
        metavar="URL|auto|off",
        help="read the engine's Prometheus metrics (vLLM, SGLang, TGI, llama-server) into the "
        "engine gauges: queue depth, running, batch size, KV cache, preemptions; auto: "
        "<upstream>/metrics, once it answers (default: %(default)s)",
    )
    parser.add_argument(
        "--upstream-metrics-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how often to read them (default: %(default)s)",
    )
    parser.add_argument(
        "--engine-spans",
        choices=("auto", "always", "never"),
        default="auto",
        help="join the engine's own request spans (OTLP/HTTP, POST /v1/traces on this port: "
        "vLLM, SGLang, TGI) to the records, for queue, prefill and decode: a finished request "
        "waits up to --engine-span-wait for its span; auto: once the engine has sent one "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--provider-name",
        default="auto",
        help="gen_ai.provider.name on the GenAI-convention spans and metrics; auto: the "
        "engine's name from its /v1/models owned_by (vllm, sglang, llama_cpp, ...), read once "
        "at startup with the models it lists (default: %(default)s)",
    )
    parser.add_argument(
        "--engine-span-wait",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long a finished request waits for its engine span before it is recorded "
        "without it; above the engine's export delay (vLLM: 5 s) (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    from slo.cli.proxy_workers import resolve_workers, run_workers

    workers = resolve_workers(args.workers)
    check_flags(args)
    context, token = read_access(args)
    if workers > 1:
        # Everything a worker will build is built and checked here first (flags, TLS files,
        # spec, store, the upstream's listing): a mistake is one line before any worker starts.
        built = build(args, context, token, scrape=False)
        built.close()
        run_workers(args, built.listing, workers)
        return 0
    built = build(args, context, token)
    run_until_stopped(
        built.app,
        built.close,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        shutdown_timeout_s=args.shutdown_timeout,
        pass_through_headers=True,
        ssl_context=context,
    )
    return 0


def check_flags(args: argparse.Namespace) -> None:
    """The numeric flags, checked before anything is read or started."""
    if args.max_connections < 1:
        raise UsageError(f"--max-connections must be at least 1, got {args.max_connections}")
    check_positive_seconds(
        {
            "--connect-timeout": args.connect_timeout,
            "--read-timeout": args.read_timeout,
            "--shutdown-timeout": args.shutdown_timeout,
            "--upstream-metrics-interval": args.upstream_metrics_interval,
            "--engine-span-wait": args.engine_span_wait,
        }
    )


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
) -> Built:
    """The app `slo proxy` serves, from its flags; `listing`: the upstream's, already read
    (a worker takes its parent's), `scrape`: read the engine's /metrics (one worker does)."""
    from middleware import LatencyMiddleware

    proxy = _proxy_app(args)
    scrape_url = _metrics_url(args.upstream_metrics, proxy.upstream_url)
    model: str = args.model
    if listing is None:
        listing = _provider_and_models(args.provider_name, proxy.upstream_url, proxy.pool.tls)
    provider_name, listed = listing
    middleware = LatencyMiddleware(
        limit_addresses(proxy, args),
        spec=args.spec,
        store=args.store,
        model=model,
        alertmanager_url=args.alertmanager_url,
        auth=args.api_keys,
        inject_usage=args.inject_usage,
        engine_spans=args.engine_spans,
        engine_span_wait_s=args.engine_span_wait,
        propagate_trace=True,  # the engine's span then lands in our trace, found by its id
        provider_name=provider_name,
        models=listed,
    )
    where = f"{scheme(context)}://{args.host}:{args.port}"
    print(f"proxying {where} -> {proxy.upstream_url} (model {model})")
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


def _add_upstream_tls_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS to the upstream (an https:// --upstream)")
    group.add_argument(
        "--upstream-ca-certs",
        default=None,
        metavar="PEM",
        help="verify the upstream's certificate against these CAs (default: the system's)",
    )
    group.add_argument(
        "--upstream-certfile",
        default=None,
        metavar="PEM",
        help="present this client certificate to the upstream (mTLS)",
    )
    group.add_argument(
        "--upstream-keyfile",
        default=None,
        metavar="PEM",
        help="its private key (default: read from --upstream-certfile)",
    )
    group.add_argument(
        "--upstream-insecure",
        action="store_true",
        help="do not verify the upstream's certificate (anyone on the path can read and "
        "change the traffic); for a test bench only",
    )


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
