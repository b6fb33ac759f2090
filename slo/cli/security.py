"""The security flags `slo serve` and `slo proxy` share: TLS, the operations token and the
per-address rate limit, read and checked before anything starts (docs/security.md)."""

from __future__ import annotations

import argparse
import os
import ssl
import sys
from typing import TYPE_CHECKING

from slo.cli.tls import add_server_tls_flags, read_token_file, server_context, server_tls_from_args
from slo.errors import UsageError

if TYPE_CHECKING:
    from middleware.core import LatencyMiddleware
    from middleware.types import ASGIApp

OPS_TOKEN_ENV = "LLM_SLO_OPS_TOKEN_FILE"


def add_security_flags(parser: argparse.ArgumentParser) -> None:
    add_server_tls_flags(parser)
    group = parser.add_argument_group("access (see docs/security.md)")
    group.add_argument(
        "--ops-token-file",
        default=None,
        metavar="FILE",
        help="/metrics, /slo, /slo.html and POST /v1/traces then need 'Authorization: Bearer "
        f"<token>' (the file's first line); also from ${OPS_TOKEN_ENV} (default: open)",
    )
    group.add_argument(
        "--ip-requests-per-minute",
        type=float,
        default=None,
        metavar="N",
        help="limit each client address to N requests a minute (bursts of N), 429 with "
        "Retry-After beyond; IPv6 counted per /64 (default: no limit)",
    )
    group.add_argument(
        "--trusted-proxies",
        default="",
        metavar="CIDR,...",
        help="believe X-Forwarded-For only from these addresses (load balancers in front); "
        "from anyone else the TCP peer is the client (default: none)",
    )


def read_access(args: argparse.Namespace) -> tuple[ssl.SSLContext | None, str | None]:
    """(the listener's TLS context, the operations token), and the outbound credentials
    checked: every file read now, before the server (or the engine) starts."""
    context, token = tls_context(args), ops_token(args)
    check_outbound_credentials()
    return context, token


def tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The listener's TLS context (None: plain HTTP), every file checked now."""
    tls = server_tls_from_args(args)
    return None if tls is None else server_context(tls)


def ops_token(args: argparse.Namespace) -> str | None:
    path: str | None = args.ops_token_file
    if path is not None:
        return read_token_file("--ops-token-file", path)
    from_env = os.environ.get(OPS_TOKEN_ENV)
    if from_env:
        return read_token_file(f"${OPS_TOKEN_ENV}", from_env)
    return None


def check_outbound_credentials() -> None:
    """The Alertmanager push's CA and token files (environment), read now rather than at the
    first alert, when no one is watching."""
    ca_file = os.environ.get("LLM_SLO_ALERTMANAGER_CA_FILE")
    if ca_file:
        from slo.cli.tls import client_context

        client_context(ca_certs=ca_file, ca_flag="$LLM_SLO_ALERTMANAGER_CA_FILE")
    token_file = os.environ.get("LLM_SLO_ALERTMANAGER_TOKEN_FILE")
    if token_file:
        read_token_file("$LLM_SLO_ALERTMANAGER_TOKEN_FILE", token_file)


def limit_addresses(app: ASGIApp, args: argparse.Namespace) -> ASGIApp:
    """`app` behind the per-address limit, when one is asked for. It goes inside the
    measurement, so its 429s are recorded and counted like the per-key limiter's."""
    per_minute: float | None = args.ip_requests_per_minute
    proxies = [part for part in args.trusted_proxies.split(",") if part.strip()]
    if per_minute is None:
        if proxies:
            raise UsageError("--trusted-proxies is read only with --ip-requests-per-minute; add it")
        return app
    if per_minute <= 0:
        raise UsageError(f"--ip-requests-per-minute must be a positive number, got {per_minute:g}")
    from middleware.ip_limits import IpLimitMiddleware, IpRateLimiter

    try:
        return IpLimitMiddleware(app, IpRateLimiter(per_minute), proxies)
    except ValueError as error:
        raise UsageError(str(error)) from None


def guard_operations(
    app: ASGIApp, middleware: LatencyMiddleware | None, token: str | None
) -> ASGIApp:
    """`app` with its operations endpoints behind `token`; without one, say once that they
    are open (a deliberate choice for a loopback-only sidecar, a mistake on a public port)."""
    if middleware is None:
        return app
    paths = [middleware.metrics_path, middleware.slo_path, middleware.slo_path + ".html"]
    if middleware.traces_path is not None:
        paths.append(middleware.traces_path)
    if token is None:
        print(
            f"warning: {', '.join(paths)} answer anyone who can reach this port; "
            f"protect them with --ops-token-file (docs/security.md)",
            file=sys.stderr,
        )
        return app
    from middleware.ops_guard import OpsGuard

    return OpsGuard(
        app,
        token,
        paths,
        page_paths=[middleware.slo_path + ".html"],
        intake_paths=[middleware.traces_path] if middleware.traces_path else [],
    )


def scheme(context: ssl.SSLContext | None) -> str:
    return "http" if context is None else "https"
