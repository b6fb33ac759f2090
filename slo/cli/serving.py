"""Run an ASGI app under uvicorn until SIGTERM, then flush: what `slo serve` and `slo proxy` share."""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

from slo.errors import UsageError

if TYPE_CHECKING:
    from middleware.types import ASGIApp


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
) -> None:
    """Serve `app`; on the way out (SIGTERM included) call `close` to flush every record.

    `pass_through_headers` (the proxy): the C parser (and uvloop where installed) keeps the cost
    per chunk low, and the upstream's own Server and Date headers pass through instead of ours.
    """
    import uvicorn

    # uvicorn drains on SIGTERM (stops accepting, lets in-flight requests finish), then raises
    # the signal again for the handler it found. With the default handler that kills the
    # process before the records are flushed; this one exits through `finally` instead.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level=log_level,
            # typed int by uvicorn, but it is an asyncio.wait_for timeout: seconds as a float
            timeout_graceful_shutdown=shutdown_timeout_s,  # type: ignore[arg-type]
            http="httptools" if pass_through_headers else "auto",
            server_header=not pass_through_headers,
            date_header=not pass_through_headers,
        )
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the flush
        close()


def _exit_cleanly(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)
