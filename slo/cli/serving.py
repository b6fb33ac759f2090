"""Run an ASGI app under uvicorn until SIGTERM, then flush: what `slo serve` and `slo proxy`
share."""

from __future__ import annotations

import argparse
import contextlib
import signal
import ssl
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

from slo.cli.common.flags import add_number_flag, add_seconds_flag, add_spec_flag
from slo.errors import UsageError

# The proxy's uvicorn protocol: httptools, with streamed body pieces written directly.
DIRECT_BODY_PROTOCOL = "slo.cli.proxy.direct:DirectBodyProtocol"

if TYPE_CHECKING:
    from middleware.types import ASGIApp


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    """The flags every HTTP server of the CLI takes (`slo serve`, `slo proxy`): where it listens,
    what it is judged by, where records and alerts go, keys, shutdown and logging."""
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: %(default)s)"
    )
    add_number_flag(parser, "--port", int, 8000, "port to bind")
    add_spec_flag(parser)
    parser.add_argument(
        "--store",
        default="sqlite:///slo-records.db",
        help="where request records go: sqlite:///FILE or postgresql://... (default: %(default)s)",
    )
    parser.add_argument(
        "--alertmanager-url",
        default=None,
        help="push alerts the live SLO evaluator fires to this Alertmanager (e.g. http://127.0.0.1:9093)",
    )
    parser.add_argument(
        "--api-keys",
        default=None,
        metavar="FILE",
        help="require API keys from this YAML file (hashed; per-key tier and rate limits); "
        "`slo keys new` writes it",
    )
    add_seconds_flag(
        parser,
        "--shutdown-timeout",
        30.0,
        "on SIGTERM, stop accepting and give in-flight requests this long to finish before they "
        "are cut; every record is flushed either way",
        metavar="SECONDS",
    )
    parser.add_argument(
        "--log-level", default="warning", help="uvicorn log level (default: %(default)s)"
    )


DEFAULT_SERVER_HEADER = "llm-slo"  # uvicorn's default names itself; no name or version here


def add_server_header_flag(parser: argparse.ArgumentParser) -> None:
    """`--server-header` (slo serve; slo proxy passes the upstream's own Server header)."""
    parser.add_argument(
        "--server-header",
        type=_header_value,
        default=DEFAULT_SERVER_HEADER,
        metavar="VALUE",
        help="the Server header of every response (default: %(default)s); '' sends none",
    )


def _header_value(value: str) -> str:
    if not all(" " <= char <= "~" for char in value):
        raise argparse.ArgumentTypeError(f"{value!r}: use printable ASCII, no line breaks")
    return value


def check_positive_seconds(flags: dict[str, float | None]) -> None:
    """Each timeout flag, when given, is a positive number of seconds."""
    for flag, value in flags.items():
        if value is not None and value <= 0:
            raise UsageError(f"{flag} must be a positive number of seconds, got {value}")


def run_until_stopped(
    app: ASGIApp,
    close: Callable[[], None],
    *,
    host: str,
    port: int,
    log_level: str,
    shutdown_timeout_s: float,
    pass_through_headers: bool = False,
    ssl_context: ssl.SSLContext | None = None,
    server_header: str = DEFAULT_SERVER_HEADER,
) -> None:
    """Serve `app`; on the way out (SIGTERM included) call `close` to flush every record.

    `pass_through_headers` (the proxy): the C parser (and uvloop where installed) keeps the cost
    per chunk low, stream pieces are written to the client as they arrive (slo.cli.proxy.direct),
    and the upstream's own Server and Date headers pass through instead of ours.
    `ssl_context` (slo.cli.tls.server_context): serve HTTPS with it. `server_header`: the Server
    header's value ('' for none).
    """
    import uvicorn

    from slo.cli.tls import uvicorn_config

    # uvicorn drains on SIGTERM (stops accepting, lets in-flight requests finish), then raises
    # the signal again for the handler it found. With the default handler that kills the
    # process before the records are flushed; this one exits through `finally` instead.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        config = uvicorn_config(
            ssl_context,
            app,
            host=host,
            port=port,
            log_level=log_level,
            # typed int by uvicorn, but it is an asyncio.wait_for timeout: seconds as a float
            timeout_graceful_shutdown=shutdown_timeout_s,  # type: ignore[arg-type]
            http=DIRECT_BODY_PROTOCOL if pass_through_headers else "auto",
            server_header=False,  # uvicorn's own names it: ours, or none, instead
            headers=[("server", server_header)]
            if server_header and not pass_through_headers
            else [],
            date_header=not pass_through_headers,
            # X-Forwarded-For is believed only from --trusted-proxies (middleware.ip_limits);
            # uvicorn's own rewrite would believe any local process's.
            proxy_headers=False,
        )
        server = uvicorn.Server(config)
        with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises Ctrl-C once drained
            server.run()
        if not server.started:  # as uvicorn.run: the port was taken, the app failed to start
            raise SystemExit(3)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the flush
        close()


def _exit_cleanly(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)
