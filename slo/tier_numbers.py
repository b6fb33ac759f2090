"""Per-tier numbers as a flag takes them: 'premium=0.2,standard=0.8' (`slo bench --tier-mix`,
`slo plan --rate`)."""

from __future__ import annotations

import math

from slo.errors import UsageError


def parse_tier_numbers(text: str, flag: str, form: str) -> list[tuple[str, float]]:
    """(tier, number) per comma-separated part, in order, empty parts skipped. A part that is
    not TIER=NUMBER with the number finite and >= 0 is one line: `{flag}: 'part' is not {form}`
    (the form and an example, e.g. "TIER=WEIGHT; write e.g. premium=0.2,standard=0.8")."""
    pairs: list[tuple[str, float]] = []
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        name, sep, value = part.partition("=")
        try:
            number = float(value) if sep else math.nan
        except ValueError:
            number = math.nan
        if not name.strip() or not math.isfinite(number) or number < 0:
            raise UsageError(f"{flag}: {part!r} is not {form}")
        pairs.append((name.strip(), number))
    return pairs
