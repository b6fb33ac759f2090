"""The timeline of the request being handled, in a context variable: engines that run in the
request's context report their phases on it (`current_timeline().mark(...)`)."""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from middleware.request.timeline import RequestTimeline

_current: contextvars.ContextVar[RequestTimeline | None] = contextvars.ContextVar(
    "llm_slo_timeline", default=None
)


def current_timeline() -> RequestTimeline | None:
    """The timeline of the request being handled here, for engines that report phases themselves:

    timeline = current_timeline()
    if timeline is not None:
        timeline.mark("prefill_start")
    """
    return _current.get()


def set_current_timeline(
    timeline: RequestTimeline | None,
) -> contextvars.Token[RequestTimeline | None]:
    return _current.set(timeline)


def reset_current_timeline(token: contextvars.Token[RequestTimeline | None]) -> None:
    _current.reset(token)
