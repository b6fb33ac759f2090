"""`MeasuredRequest`: one request as one object, from the door to its report.

Made when the middleware takes the request (`middleware.core`), ended when the app returns or
raises, settled once (`settle`: the counts its answer carried, the tier the layers decided,
the outcome and status), then read by everything that reports it: the record
(`middleware.request.reporting.record_fields`), the span's attributes, the metrics and the live
windows (`middleware.request.settle.Reporter`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from slo.sli import outcome_for_status

if TYPE_CHECKING:
    from middleware.capture import CaptureBuffer
    from middleware.intake.propagate import HandedIds
    from middleware.request.exchange import Exchange
    from middleware.request.state import RequestState
    from middleware.request.timeline import RequestTimeline


def classify_outcome(
    status: int, disconnected: bool, complete: bool, hint: str | None, raised: bool
) -> str:
    if disconnected and not complete:
        return "cancelled"
    if raised:
        return "server_error"
    if hint:
        return hint
    return outcome_for_status(status)


@dataclass(slots=True, eq=False)
class MeasuredRequest:
    exchange: Exchange
    timeline: RequestTimeline  # the exchange's
    state: RequestState  # the request's scope state, read when it is settled
    tier: str  # as the spec resolved it at the door, until `settle`
    route: str
    headers: dict[str, str]
    # The ids of our request span, already handed to the app in `traceparent`.
    ids: HandedIds | None
    # What the engine's span finds it by (`Reporter.join_keys`); None: no span can.
    join_keys: tuple[str, str | None] | None
    raised: bool = False  # the app raised instead of returning
    outcome: str = "ok"  # from `settle` on
    status: int = 500  # from `settle` on: the status the client got

    @property
    def input_tokens(self) -> int:
        return self.timeline.input_tokens

    @property
    def captured(self) -> CaptureBuffer | None:
        """The bodies, when content capture is on."""
        return self.state.get("capture")

    def settle(self) -> None:
        """The app is done: take the counts the answer carried, the tier the layers decided
        (the API key's may have), and how it ended."""
        exchange = self.exchange
        exchange.settle()
        state = self.state
        self.tier = state.get("tier", self.tier)
        raised = self.raised
        self.outcome = classify_outcome(
            exchange.status,
            exchange.disconnected,
            exchange.complete or exchange.delivered,
            state.get("outcome"),
            raised and not exchange.delivered,
        )
        self.status = 500 if raised and not exchange.started else exchange.status
