"""Alertmanager configuration: one notification per incident, routed by severity and tier.

- Grouping by tier and phase (`GROUP_BY`): when TTFT, e2e and goodput burn together for the
  same tier because the same phase grew, they share one notification, not three.
- A route per severity, each with its repeat interval: critical (pages) every hour, warning
  (tickets) every 4 hours, info once a day; then per tier, so a team can point premium pages
  at a pager and batch tickets at a queue by editing one URL (all start at the same
  placeholder).
- Escalation: every page also follows a second route to `llm-slo-escalation`, whose group
  waits `escalate_after` (30m) before its first notification. Acknowledging a page means
  silencing it in Alertmanager; a page nobody silenced in that time reaches the escalation
  receiver.
- Inhibitions keep the most severe: a page silences tickets and infos about the same tier and
  SLI, a ticket silences infos; a page or ticket also silences the anomaly infos about the same
  tier and phase (the early warning said it first; the page says it all).

Each webhook may take an `http_config` (authorization, TLS) rendered under every receiver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from alerts.templating import render
from slo.alert_rules import SEVERITIES
from slo.spec import SLOSpec

DEFAULT_WEBHOOK_URL = "http://127.0.0.1:5001/llm-slo/alerts"
GROUP_BY: tuple[str, ...] = ("tier", "phase")
# Inhibition: a critical alert silences warnings and infos about the same tier and SLI, a
# warning silences infos (the burn-rate page says it all; the p95 warning is the same fire).
INHIBIT_EQUAL: tuple[str, ...] = ("tier", "sli")
# ... and a page or ticket silences the anomaly infos of the same tier and phase.
ANOMALY_INHIBIT_EQUAL: tuple[str, ...] = ("tier", "phase")
ESCALATION_RECEIVER = "llm-slo-escalation"
_TIERED: tuple[str, ...] = ("critical", "warning")


@dataclass(frozen=True)
class Timing:
    """Alertmanager's notification pacing; tests shorten it, production keeps the defaults."""

    group_wait: str = "30s"
    group_interval: str = "5m"
    repeat_interval: str = "4h"
    critical_repeat_interval: str = "1h"
    resolve_timeout: str = "5m"
    info_repeat_interval: str = "24h"
    escalate_after: str = "30m"

    def repeat(self, severity: str) -> str:
        return {
            "critical": self.critical_repeat_interval,
            "info": self.info_repeat_interval,
        }.get(severity, self.repeat_interval)


def receiver_name(severity: str, tier: str | None = None) -> str:
    """The receiver an alert of this severity (and tier) reaches first."""
    if severity in _TIERED and tier is not None:
        return f"llm-slo-{severity}-{tier}"
    return f"llm-slo-{severity}"


def receivers_of(severity: str, tier: str | None = None) -> str:
    """Every receiver an alert reaches, as `amtool config routes test` prints them."""
    first = receiver_name(severity, tier)
    return f"{first},{ESCALATION_RECEIVER}" if severity == "critical" else first


def routes(spec: SLOSpec) -> list[tuple[dict[str, str], str]]:
    """(labels, expected receivers) for `amtool config routes test`, per severity and tier."""
    cases: list[tuple[dict[str, str], str]] = []
    for severity in SEVERITIES:
        cases.append(({"severity": severity}, receivers_of(severity)))
        for tier in spec.tiers:
            labels = {"severity": severity, "tier": tier.name}
            cases.append((labels, receivers_of(severity, tier.name)))
    cases.append(({}, "llm-slo-default"))
    return cases


def render_alertmanager(
    spec: SLOSpec,
    webhook_url: str = DEFAULT_WEBHOOK_URL,
    timing: Timing | None = None,
    http_config: dict[str, Any] | None = None,
) -> str:
    """The config; `http_config` (e.g. {"authorization": {"credentials_file": ...}}) goes
    under every webhook as written."""
    timing = timing or Timing()
    tiers = [tier.name for tier in spec.tiers]
    receivers = ["llm-slo-default"]
    for severity in SEVERITIES:
        receivers.append(receiver_name(severity))
        if severity in _TIERED:
            receivers.extend(receiver_name(severity, tier) for tier in tiers)
    receivers.append(ESCALATION_RECEIVER)
    return render(
        "alertmanager.yml.j2",
        source=spec.source,
        tiers=tiers,
        severities=SEVERITIES,
        tiered=_TIERED,
        receivers=receivers,
        receiver_name=receiver_name,
        escalation=ESCALATION_RECEIVER,
        webhook_url=webhook_url,
        http_config=http_config or {},
        timing=timing,
        group_by=GROUP_BY,
        inhibit_equal=INHIBIT_EQUAL,
        anomaly_inhibit_equal=ANOMALY_INHIBIT_EQUAL,
    )
