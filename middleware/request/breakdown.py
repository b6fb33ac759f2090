"""`Breakdown`: everything derived from one finished request's timeline, in seconds.

The additive parts (`phases`) sum to e2e: see `middleware.request.timeline` for how the request's
critical path is cut into them. A latency SLI that none of the fields below measures is
measured here too, from the timeline's marks: one function in `MEASURED_FROM_MARKS`, under
its record field (CONTRIBUTING.md: add a latency SLI, end to end).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slo.sli import PHASES

if TYPE_CHECKING:
    from middleware.request.timeline import RequestTimeline

NS = 1e-9


@dataclass(frozen=True)
class Breakdown:
    """Everything derived from a finished timeline, in seconds."""

    e2e_s: float
    ttft_s: float | None
    tpot_s: float | None
    itl_s: tuple[float, ...]
    network_s: float
    queue_s: float | None
    prefill_s: float | None
    decode_s: float
    detokenize_s: float
    other_s: float
    output_tokens: int
    # The engine's time before the first token when it does not report queue and prefill.
    queue_prefill_s: float | None = None
    # Where output_tokens comes from (slo.sli.TOKENS_SOURCES).
    tokens_source: str = "chunks"

    @property
    def phase_seconds(self) -> tuple[float, ...]:
        """The additive parts, unknown ones as 0, in PHASES order: they sum to e2e."""
        return (
            self.network_s,
            self.queue_s or 0.0,
            self.prefill_s or 0.0,
            self.queue_prefill_s or 0.0,
            self.decode_s,
            self.detokenize_s,
            self.other_s,
        )

    @property
    def phases(self) -> dict[str, float]:
        """`phase_seconds` by phase name (slo.sli.PHASES)."""
        return dict(zip(PHASES, self.phase_seconds, strict=True))

    @classmethod
    def _of(cls, fields: dict[str, Any]) -> Breakdown:
        # The frozen __init__ pays one object.__setattr__ call per field, and a request makes
        # two breakdowns on the hot path: `fields` (a dict made for it: keyword arguments
        # would cost 10x) becomes the instance's dict in one step instead.
        breakdown = object.__new__(cls)
        object.__setattr__(breakdown, "__dict__", fields)
        return breakdown


# Record field -> its value (seconds, or None when the request has no such moment) from a
# finished request's timeline: RequestTimeline.breakdown puts each on the Breakdown under that
# name, and from there it reaches the record, the histogram and the live windows like the
# fields above. Its marks are perf_counter nanoseconds (`timeline.start_ns`, `body_chunk_ns`,
# `token_ns`, `first_token_byte_ns`, `last_byte_ns`, ...).
MEASURED_FROM_MARKS: dict[str, Callable[[RequestTimeline], float | None]] = {}


def measured_fields() -> tuple[str, ...]:
    """Every attribute a Breakdown carries: its fields, then what is measured from marks."""
    own = tuple(field.name for field in dataclasses.fields(Breakdown))
    return (*own, *(name for name in MEASURED_FROM_MARKS if name not in own))
