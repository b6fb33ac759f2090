"""Who made each tier wait, summed over records: each tier's `delay_blame` seconds by culprit
tier and cause (docs/blame.md), for `slo report`'s chart and the overload demo's report."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slo.engine_slis import NO_CULPRIT


@dataclass
class TierBlame:
    """One tier's blamed seconds over the records, by (culprit tier, cause)."""

    seconds: dict[tuple[str, str], float] = field(default_factory=dict)
    requests: int = 0  # records with blame
    estimated: bool = False

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())

    def shares(self) -> dict[tuple[str, str], float]:
        total = self.total_s
        return {key: s / total for key, s in self.seconds.items()} if total else {}


def blame_by_tier(rows: Iterable[Mapping[str, Any]]) -> dict[str, TierBlame]:
    """Each tier's blame summed over the records that carry `delay_blame`."""
    tiers: dict[str, TierBlame] = {}
    for row in rows:
        blame = row.get("delay_blame")
        if not blame:
            continue
        tier = tiers.setdefault(row["tier"], TierBlame())
        tier.requests += 1
        tier.estimated = tier.estimated or bool(blame.get("estimated"))
        for entry in blame["by_tier"]:
            key = (str(entry["tier"]), entry["cause"])
            tier.seconds[key] = tier.seconds.get(key, 0.0) + entry["s"]
    return tiers


def named_share(tier: TierBlame, culprit: str, causes: tuple[str, ...]) -> float | None:
    """The share of `tier`'s blame of `causes` that names a tier and names `culprit` (queue
    time with nobody ahead left out); None when none of it names a tier."""
    named = {k: s for k, s in tier.seconds.items() if k[1] in causes and k[0] != NO_CULPRIT}
    total = sum(named.values())
    if not total:
        return None
    return sum(s for (who, _), s in named.items() if who == culprit) / total
