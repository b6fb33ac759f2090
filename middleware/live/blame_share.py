"""Who made each tier wait, for `/slo.html`: shares of `llm_slo_delay_caused_seconds_total`.

The counter holds, per tier, the seconds each culprit tier caused by cause since the server
started: exact from the bundled engine (`estimated="false"`), estimated in front of any other
(`"true"`, docs/blame.md). The page shows, per tier, the largest share of the wait that its
headline objective feels and who caused it ("premium p99 ITL: 62% batch prefill
interference"), and the few largest shares of all its blamed wait.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slo.engine_slis import NO_CULPRIT
from slo.sli import CATALOG

if TYPE_CHECKING:
    from slo.spec.objectives import Objective

TOP_SHARES = 3
MIN_SHARE = 0.005  # a share the page would print as 0% is left out
_ACRONYMS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}
# The causes a latency SLI feels: a request queues before its first token, and prefill
# interference slows its decode; a preemption can come at either side of the first token.
_FELT_BY = {
    "ttft": ("queue", "preemption"),
    "itl": ("interference", "preemption"),
    "tpot": ("interference", "preemption"),
}
_CAUSE_WORDS = {"queue": "queue", "interference": "prefill interference"}

Caused = dict[tuple[str, str, bool], float]  # (culprit tier, cause, estimated): seconds


def delay_caused(metrics: Any) -> dict[str, Caused]:
    """Each tier's blamed seconds since start, from the counter /metrics exports, by culprit
    tier, cause and whether they are estimated; children still at 0 are left out."""
    name = CATALOG["delay_caused"].metric
    caused: dict[str, Caused] = {}
    for metric in metrics.registry.restricted_registry([name]).collect():
        for sample in metric.samples:
            labels = sample.labels
            if sample.name != name or labels.get("model") != metrics.model or not sample.value:
                continue
            key = (labels["culprit_tier"], labels["cause"], labels["estimated"] == "true")
            by_key = caused.setdefault(labels["tier"], {})
            by_key[key] = by_key.get(key, 0.0) + sample.value
    return caused


def tier_blame(caused: Caused, headline: Objective | None) -> dict[str, Any] | None:
    """The page's blame for one tier: its total blamed seconds, the largest shares of them,
    and the headline (the largest share of what the headline objective's SLI feels); None
    when nothing was blamed."""
    total = sum(caused.values())
    if not total:
        return None
    ranked = sorted(caused.items(), key=lambda item: -item[1])
    shown = [item for item in ranked[:TOP_SHARES] if item[1] >= MIN_SHARE * total]
    return {
        "total_s": _round(total),
        "estimated": any(estimated for (_, _, estimated) in caused),
        "top": [_share(key, seconds, total) for key, seconds in shown],
        "headline": _headline(caused, headline),
    }


def _headline(caused: Caused, objective: Objective | None) -> str | None:
    felt = _FELT_BY.get(objective.sli or "", ()) if objective is not None else ()
    relevant = {key: s for key, s in caused.items() if not felt or key[1] in felt}
    total = sum(relevant.values())
    if not total:
        return None
    key, seconds = max(relevant.items(), key=lambda item: item[1])
    return f"{_objective_words(objective)}{seconds / total:.0%} {_culprit_words(key)}"


def _objective_words(objective: Objective | None) -> str:
    if objective is None or objective.kind != "latency" or not objective.sli:
        return ""
    return f"p{objective.percentile:g} {_ACRONYMS.get(objective.sli, objective.sli)}: "


def _culprit_words(key: tuple[str, str, bool]) -> str:
    culprit, cause, estimated = key
    cause_words = _CAUSE_WORDS.get(cause, cause)
    words = (
        f"{cause_words} with nobody ahead" if culprit == NO_CULPRIT else f"{culprit} {cause_words}"
    )
    return f"{words} (estimated)" if estimated else words


def _share(key: tuple[str, str, bool], seconds: float, total: float) -> dict[str, Any]:
    culprit, cause, estimated = key
    return {
        "culprit": culprit,
        "cause": cause,
        "estimated": estimated,
        "s": _round(seconds),
        "share": _round(seconds / total),
        "text": f"{seconds / total:.0%} {_culprit_words(key)}",
    }


def _round(value: float) -> float:
    return float(f"{value:.6g}")
