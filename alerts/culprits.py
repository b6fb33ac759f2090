"""Who made the tier wait, in PromQL: the recording rules and the `culprit` annotation of every
latency alert.

The bundled engine blames each request's waits on the requests that caused them
(`llm_slo_delay_caused_seconds_total{tier, culprit_tier, cause}`, docs/blame.md). Per tier,
every evaluation records each culprit tier's blamed delay per second by cause, and its share
of the delay blamed for the tier's requests, over the last 5 minutes (`culprit_tier="none"`,
queue time nobody caused, counts in the whole). A latency alert's `culprit` annotation reads
the largest share that a tier caused back with a `query` template, so the page says "batch
caused 90% of ... (queue)", and the runbook says what to do about that cause. An engine that
blames nothing keeps the counter at 0: the annotation then says so.
"""

from __future__ import annotations

from alerts.rule_types import Rule
from slo.promql import CULPRIT_RATE_RECORD, CULPRIT_SHARE_RECORD, prom_duration, selector
from slo.sli import CATALOG
from slo.spec import Tier

WINDOW_S = 300.0
NOBODY = "none"  # the culprit tier of queue time that nobody caused (an idle engine)
NO_CULPRIT = (
    "No delay blamed on another request over the last 5m: the engine reports no blame and "
    "nothing estimates it (slo proxy does), or the tier waited for nobody."
)


def culprit_records(tier: Tier) -> list[Rule]:
    """The tier's blamed delay per culprit tier and cause, and each one's share of the whole
    (no share without delay: never 0/0)."""
    own = {"tier": tier.name}
    caused = selector(CATALOG["delay_caused"].metric, tier=tier.name)
    by_culprit = f"sum by (tier, culprit_tier, cause) (rate({caused}[{prom_duration(WINDOW_S)}]))"
    rates = selector(CULPRIT_RATE_RECORD, tier=tier.name)
    share = f"{rates}\n/ on (tier) group_left ()\n(sum by (tier) ({rates}) > 0)"
    return [
        Rule(by_culprit, record=CULPRIT_RATE_RECORD, labels=own),
        Rule(share, record=CULPRIT_SHARE_RECORD, labels=own),
    ]


def culprit_text(culprit: tuple[str, str, float] | None) -> str:
    """What `culprit_annotation` expands to for (culprit tier, cause, share), or None."""
    if culprit is None:
        return NO_CULPRIT
    tier, cause, share = culprit
    return (
        f"{tier} caused {share * 100:.4g}% of the delay blamed for this tier's requests over "
        f"the last {prom_duration(WINDOW_S)} ({cause})."
    )


def culprit_annotation() -> str:
    """The `culprit` annotation: the largest share a tier caused, its tier and its cause."""
    top = f'topk(1, {CULPRIT_SHARE_RECORD}{{tier=%q, culprit_tier!=\\"{NOBODY}\\"}})'
    query = f'printf "{top}" $labels.tier'
    shown = (
        "{{ .Labels.culprit_tier }} caused {{ .Value | humanizePercentage }} of the delay "
        f"blamed for this tier's requests over the last {prom_duration(WINDOW_S)} "
        "({{ .Labels.cause }})."
    )
    found = f"{{{{ with first . }}}}{shown}{{{{ end }}}}"
    return f"{{{{ with query ({query}) }}}}{found}{{{{ else }}}}{NO_CULPRIT}{{{{ end }}}}"
