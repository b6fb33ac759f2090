"""`UpstreamReport`: the counts and phases an engine reported for one request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class UpstreamReport:
    """Filled by the adapters; None means the engine did not say.

    Phases are seconds. `decode_s` is used only for responses that are not streamed (a stream's
    decode is measured between its token chunks).
    """

    output_tokens: int | None = None
    input_tokens: int | None = None
    cached_tokens: int | None = None
    # Which adapter gave output_tokens: "usage" or "timings" (slo.sli.TOKENS_SOURCES).
    tokens_source: str | None = None
    queue_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    # The phases come from the engine's own request span (`middleware.intake`): they cover
    # the engine's whole part of the request, streamed or not, decode included.
    from_span: bool = False
