"""`Later`: reports that wait a moment, so the request that comes as another ends starts first.

A response's last byte is out before its report is made (span, metrics, live windows, record:
about 0.1 ms of Python). A client that sends its next request as soon as the last one ended (a
closed-loop client, the next turn of a chat, a load generator) finds the event loop busy with
that report, and its time to first token grows by it. Put in `Later`, reports wait `delay_s`
(one timer for all of them) and run together, once the next request's start is out: the same
work, off the path a client waits on.

Nothing reads a report's effects before it is made: whatever reads them (`/metrics`, `/slo`,
`requests_seen`, close) calls `run_now` first. With `delay_s` 0 a report runs at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

Report = Callable[[], None]


class Later:
    def __init__(self, delay_s: float) -> None:
        if delay_s < 0:
            raise ValueError(f"report delay {delay_s!r}: use 0 (report at once) or more")
        self.delay_s = delay_s
        self._waiting: deque[Report] = deque()  # popped once each, from any thread
        self._timer: asyncio.TimerHandle | None = None

    def put(self, report: Report) -> None:
        """Run `report` after `delay_s`, or at once with no delay or no running loop."""
        if not self.delay_s:
            report()
            return
        self._waiting.append(report)
        if self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # called off the loop: nothing would fire the timer
                self.run_now()
                return
            self._timer = loop.call_later(self.delay_s, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self.run_now()

    def run_now(self) -> None:
        """Run every waiting report, oldest first (each exactly once, whoever calls)."""
        waiting = self._waiting
        while waiting:
            try:
                report = waiting.popleft()
            except IndexError:  # another thread took the last one
                return
            report()

    @property
    def waiting(self) -> int:
        return len(self._waiting)
