"""Alertmanager configuration: route by severity, then tier; group; inhibit; one webhook.

Every (severity, tier) pair gets its own receiver so that a team can point premium pages at a
pager and batch tickets at a queue by editing one URL; all start at the same placeholder.
"""

from __future__ import annotations

from dataclasses import dataclass

from alerts.templating import render
from slo.alert_rules import SEVERITIES
from slo.spec import SLOSpec

DEFAULT_WEBHOOK_URL = "http://127.0.0.1:5001/llm-slo/alerts"
# Alerts of one group are sent together: same alert, tier and objective.
GROUP_BY: tuple[str, ...] = ("alertname", "tier", "objective")
# Inhibition: a critical alert silences warnings and infos about the same tier and SLI, a
# warning silences infos (the burn-rate page says it all; the p95 warning is the same fire).
INHIBIT_EQUAL: tuple[str, ...] = ("tier", "sli")
_TIERED: tuple[str, ...] = ("critical", "warning")


@dataclass(frozen=True)
class Timing:
    """Alertmanager's notification pacing; tests shorten it, production keeps the defaults."""

    group_wait: str = "30s"
    group_interval: str = "5m"
    repeat_interval: str = "4h"
    critical_repeat_interval: str = "1h"
    resolve_timeout: str = "5m"


def receiver_name(severity: str, tier: str | None = None) -> str:
    """The receiver an alert of this severity (and tier) reaches."""
    if severity in _TIERED and tier is not None:
        return f"llm-slo-{severity}-{tier}"
    return f"llm-slo-{severity}"


def routes(spec: SLOSpec) -> list[tuple[dict[str, str], str]]:
    """(labels, expected receiver) for `amtool config routes test`, one per severity and tier."""
    cases: list[tuple[dict[str, str], str]] = []
    for severity in SEVERITIES:
        cases.append(({"severity": severity}, receiver_name(severity)))
        for tier in spec.tiers:
            labels = {"severity": severity, "tier": tier.name}
            cases.append((labels, receiver_name(severity, tier.name)))
    cases.append(({}, "llm-slo-default"))
    return cases


def render_alertmanager(
    spec: SLOSpec, webhook_url: str = DEFAULT_WEBHOOK_URL, timing: Timing | None = None
) -> str:
    timing = timing or Timing()
    tiers = [tier.name for tier in spec.tiers]
    receivers = ["llm-slo-default"]
    for severity in SEVERITIES:
        receivers.append(receiver_name(severity))
        if severity in _TIERED:
            receivers.extend(receiver_name(severity, tier) for tier in tiers)
    return render(
        "alertmanager.yml.j2",
        source=spec.source,
        tiers=tiers,
        severities=SEVERITIES,
        tiered=_TIERED,
        receivers=receivers,
        receiver_name=receiver_name,
        webhook_url=webhook_url,
        timing=timing,
        group_by=GROUP_BY,
        inhibit_equal=INHIBIT_EQUAL,
    )
