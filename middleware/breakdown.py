"""`Breakdown`: everything derived from one finished request's timeline, in seconds.

The additive parts (`phases`) sum to e2e: see `middleware.timeline` for how the request's
critical path is cut into them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    def phases(self) -> dict[str, float]:
        """The additive parts (unknown ones as 0), in PHASES order: they sum to e2e."""
        return {
            "network": self.network_s,
            "queue": self.queue_s or 0.0,
            "prefill": self.prefill_s or 0.0,
            "queue_prefill": self.queue_prefill_s or 0.0,
            "decode": self.decode_s,
            "detokenize": self.detokenize_s,
            "other": self.other_s,
        }

    @classmethod
    def _of(cls, **fields: Any) -> Breakdown:
        # The frozen __init__ pays one object.__setattr__ call per field, and a request makes
        # two breakdowns on the hot path: fill the instance's dict in one step instead.
        breakdown = object.__new__(cls)
        breakdown.__dict__.update(fields)
        return breakdown
