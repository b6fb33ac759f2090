"""One way for tests to wait: poll a condition until it holds or a deadline passes."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx


def wait_until(
    check: Callable[[], bool],
    timeout_s: float,
    what: str,
    interval_s: float = 0.1,
    on_timeout: Callable[[], str] | None = None,
) -> None:
    """Return once `check()` is true; fail the test naming `what` after `timeout_s` (and what
    `on_timeout()` says of the state then)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            state = f": {on_timeout()}" if on_timeout is not None else ""
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{state}")
        time.sleep(interval_s)


def wait_for(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """`wait_until` for a condition the failure need not name, polled every 0.2 s."""
    wait_until(check, timeout_s, "the condition", interval_s=0.2)


def wait_until_ready(
    url: str, timeout_s: float = 60.0, process: subprocess.Popen[Any] | None = None
) -> None:
    """Return once `url` answers 200; a `process` that exits first fails at once."""

    def ready() -> bool:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(url, timeout=2).status_code == 200
        return False

    wait_until(ready, timeout_s, f"{url} to answer 200")
