"""The engine's blame for one request (who made it wait, docs/blame.md) as its record keeps it:
the field `delay_blame`, a bounded JSON object, tiers by name.

The engine reports priorities (it knows no tiers); a priority no tier of the spec has is
named by its number. Read structurally: any engine that hands `on_blame` an object with the
same attributes as `engine.blame.RequestBlame` works.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slo.engine_slis import NO_CULPRIT
from slo.records import BLAME_TOTALS


def blame_record(blame: Any, tier_names: Mapping[int, str]) -> dict[str, Any]:
    """`{queue_s, preempted_s, decode_s, decode_only_s, interference_s, by_tier: [{cause,
    tier, s, requests}], top: [{cause, request_id, tier, s}]}`; `tier` is the culprits'."""

    def name(priority: int | None) -> str:
        if priority is None:
            return NO_CULPRIT
        return tier_names.get(priority, str(priority))

    record: dict[str, Any] = {total: getattr(blame, total) for total in BLAME_TOTALS}
    record["by_tier"] = [
        {"cause": cause, "tier": name(priority), "s": seconds, "requests": requests}
        for cause, priority, seconds, requests in blame.by_tier
    ]
    record["top"] = [
        {"cause": cause, "request_id": request_id, "tier": name(priority), "s": seconds}
        for cause, request_id, priority, seconds in blame.top
    ]
    return record
