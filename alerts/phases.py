"""The phase to blame, in PromQL: per-tier, per-phase mean recording rules and the join that
puts a `phase` label on every latency alert.

Per tier, every evaluation records each phase's mean over the last 5 minutes (sum / count of
its histogram, summed over models, routes and replicas), the same mean over the baseline hour
(the hour that ended an hour ago: before the incident a page is about, long enough to be
steady), their difference (the growth, in seconds), and the phase's share of the mean e2e
now and then. Then, per latency SLI, the phase that grew most among those the SLI is made of
(`slo.alert_rules.phases_of`): `topk(1, ...)`. Growth is absolute, in seconds: a 1 ms
detokenize step that triples matters less than a prefill that gains 400 ms.

A latency alert's expression adds that record's `phase` label (`+ on (tier) group_left
(phase) 0 * ...`); with no phase timings for the tier it says `phase="unknown"` rather than
lose the alert. The `phase` annotation reads the shares back with `query` templates, so the
page says "prefill: 40% of e2e now, 20% before" with no dashboard open.
"""

from __future__ import annotations

from alerts.rule_types import Rule
from slo.alert_rules import PHASE_LABEL, UNATTRIBUTED, AlertRule, phases_of
from slo.promql import (
    BLAMED_PHASE_RECORD,
    E2E_MEAN_RECORD,
    PHASE_GROWTH_RECORD,
    PHASE_MEAN_BASELINE_RECORD,
    PHASE_MEAN_RECORD,
    PHASE_SHARE_BASELINE_RECORD,
    PHASE_SHARE_RECORD,
    any_of,
    matcher,
    prom_duration,
    quote,
    selector,
)
from slo.sli import CATALOG, PHASED_SLIS, PHASES
from slo.spec import Tier

NOW_S = 300.0  # the "now" of a phase mean
BASELINE_S = 3600.0  # the baseline hour ...
BASELINE_OFFSET_S = 3600.0  # ... that ended this long ago


def mean_expr(sli: str, tier: str, window_s: float = NOW_S) -> str:
    """Mean of one histogram over the window; no series without observations (never 0/0)."""
    metric = CATALOG[sli].metric
    window = prom_duration(window_s)
    total = f"sum(rate({selector(metric + '_sum', tier=tier)}[{window}]))"
    count = f"sum(rate({selector(metric + '_count', tier=tier)}[{window}]))"
    return f"{total}\n/\n({count} > 0)"


def _phase_means_expr(tier: str) -> str:
    """Every phase's mean in one rule (a cycle costs mostly per rule): each mean labelled with
    its phase, the union of them the same series one rule per phase recorded."""
    return "\nor\n".join(
        f'label_replace(\n{mean_expr(phase, tier)}\n, {quote(PHASE_LABEL)}, {quote(phase)}, "", "")'
        for phase in PHASES
    )


def _baseline(record: str, tier: str) -> str:
    window, offset = prom_duration(BASELINE_S), prom_duration(BASELINE_OFFSET_S)
    return f"avg_over_time({selector(record, tier=tier)}[{window}] offset {offset})"


def phase_records(tier: Tier) -> list[Rule]:
    """The tier's phase records, in evaluation order (each reads only those before it)."""
    name = tier.name
    own = {"tier": name}  # also static, so no two tiers' rules look alike to promtool
    rules = [
        Rule(mean_expr("e2e", name), record=E2E_MEAN_RECORD, labels=own),
        Rule(_phase_means_expr(name), record=PHASE_MEAN_RECORD, labels=own),
    ]
    mean, e2e = selector(PHASE_MEAN_RECORD, tier=name), selector(E2E_MEAN_RECORD, tier=name)
    share = f"{mean}\n/ on (tier) group_left\n{e2e}"
    baseline = selector(PHASE_MEAN_BASELINE_RECORD, tier=name)
    rules += [
        Rule(share, record=PHASE_SHARE_RECORD, labels=own),
        Rule(_baseline(PHASE_MEAN_RECORD, name), record=PHASE_MEAN_BASELINE_RECORD, labels=own),
        Rule(_baseline(PHASE_SHARE_RECORD, name), record=PHASE_SHARE_BASELINE_RECORD, labels=own),
        Rule(f"{mean}\n-\n{baseline}", record=PHASE_GROWTH_RECORD, labels=own),
    ]
    for sli in PHASED_SLIS:
        candidates = selector(
            PHASE_GROWTH_RECORD, matcher(PHASE_LABEL, "=~", any_of(phases_of(sli))), tier=name
        )
        rules.append(
            Rule(f"topk(1, {candidates})", record=BLAMED_PHASE_RECORD, labels={**own, "sli": sli})
        )
    return rules


def with_phase(rule: AlertRule, expr: str) -> str:
    """The alert's expression with the blamed phase as a label, `unknown` when none is."""
    if not rule.phases:
        return expr
    return join_phase(rule.tier or "", _blaming_sli(rule), expr)


def join_phase(tier: str, sli: str, expr: str) -> str:
    """`expr` (whose series carry `tier`) with the phase blamed for `sli` as a label.

    The right side is the blamed record, or `phase="unknown"` for the tier when there is none,
    so `expr` (a whole alert condition, quantiles over raw buckets for a threshold alert) is
    evaluated once, not once per branch."""
    blamed = selector(BLAMED_PHASE_RECORD, tier=tier, sli=sli)
    unknown = f'label_replace(vector(0), "tier", {quote(tier)}, "", "")'
    unknown = f'label_replace({unknown}, {quote(PHASE_LABEL)}, {quote(UNATTRIBUTED)}, "", "")'
    return (
        f"(\n{expr}\n)\n+ on (tier) group_left ({PHASE_LABEL})\n"
        f"(\n(0 * {blamed})\nor on (tier)\n{unknown}\n)"
    )


def _blaming_sli(rule: AlertRule) -> str:
    """The SLI whose blamed-phase record answers for this alert (a phase SLI, or goodput:
    e2e's, which blames any phase)."""
    return rule.sli if rule.sli in PHASED_SLIS else "e2e"


def _baseline_words() -> str:
    return f"the {prom_duration(BASELINE_S)} that ended {prom_duration(BASELINE_OFFSET_S)} ago"


_NO_PHASES = "No phase timings for this tier: look at the e2e breakdown on the dashboard."


def phase_text(phase: str, shares: tuple[float, float] | None) -> str:
    """What `phase_annotation` expands to (Go's humanizePercentage: %.4g of the percentage)."""
    if phase == UNATTRIBUTED or shares is None:
        return _NO_PHASES
    now, before = (f"{share * 100:.4g}%" for share in shares)
    return (
        f"{phase} grew most: {now} of the mean e2e over the last {prom_duration(NOW_S)}, "
        f"{before} over {_baseline_words()}."
    )


def phase_annotation() -> str:
    """The `phase` annotation: the blamed phase's share of the mean e2e, now and before."""
    now = _share_template(PHASE_SHARE_RECORD)
    before = _share_template(PHASE_SHARE_BASELINE_RECORD)
    return (
        f'{{{{ if eq $labels.phase "{UNATTRIBUTED}" }}}}{_NO_PHASES}'
        f"{{{{ else }}}}{{{{ $labels.phase }}}} grew most: {now} of the mean e2e over the last "
        f"{prom_duration(NOW_S)}, {before} over {_baseline_words()}.{{{{ end }}}}"
    )


def _share_template(record: str) -> str:
    query = f'printf "{record}{{tier=%q, phase=%q}}" $labels.tier $labels.phase'
    shown = "{{ . | first | value | humanizePercentage }}"
    return f"{{{{ with query ({query}) }}}}{shown}{{{{ end }}}}"
