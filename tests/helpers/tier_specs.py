"""The SLO specs of the tests, built from a few parts so each test states only what it tests.

A tier is matched on the `x-llm-tier` header by its own name unless it is the default tier
(which takes every request no other tier matches); objectives are written as the spec writes
them. `spec_yaml` gives the YAML a spec file holds; `spec` the parsed `SLOSpec`.

    spec_yaml(
        make_tier("premium", "p95 ttft <= 250ms"),
        make_tier("standard", "p95 ttft <= 5s", default=True),
        window="10m",
        alert_policy=burn_policy(burn_alert("page", "1m", "20s", 2), thresholds=()),
    )
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

from slo.spec import SLOSpec

HEADER = "x-llm-tier"
_BY_NAME: Any = object()  # `make_tier(match=...)` default: the header, valued the tier's name


def header_match(*values: str) -> dict[str, Any]:
    """A tier's `match` on the x-llm-tier header."""
    return {"header": HEADER, "values": list(values)}


def make_tier(
    name: str,
    *objectives: str,
    priority: int | None = None,
    default: bool = False,
    match: dict[str, Any] | None = _BY_NAME,
) -> dict[str, Any]:
    """One tier; a tier that is not the default is matched on the header by its name."""
    body: dict[str, Any] = {"name": name}
    if priority is not None:
        body["priority"] = priority
    if default:
        body["default"] = True
    if match is _BY_NAME:
        match = None if default else header_match(name)
    if match is not None:
        body["match"] = match
    body["objectives"] = list(objectives)
    return body


def burn_alert(severity: str, long: str, short: str, factor: float) -> dict[str, Any]:
    """One multi-window burn-rate alert of an alert policy."""
    return {"severity": severity, "long": long, "short": short, "factor": factor}


def threshold_alert(percentile: float, factor: float) -> dict[str, Any]:
    """One threshold alert of an alert policy: the percentile above factor x its objective."""
    return {"percentile": percentile, "factor": factor}


def burn_policy(
    *burn_rates: dict[str, Any],
    min_events: int = 5,
    thresholds: Iterable[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """An alert policy: these burn rates, and these threshold alerts (None: the spec's default
    ones; () for none)."""
    policy: dict[str, Any] = {"min_events": min_events, "burn_rates": list(burn_rates)}
    if thresholds is not None:
        policy["thresholds"] = list(thresholds)
    return policy


def spec_yaml(
    *tiers: dict[str, Any],
    window: str | None = "1h",
    min_events: int | None = None,
    alert_policy: dict[str, Any] | None = None,
) -> str:
    """The YAML of a spec file (version 1) with these tiers, in this order."""
    document: dict[str, Any] = {"version": 1}
    if window is not None:
        document["window"] = window
    if min_events is not None:
        document["min_events"] = min_events
    document["tiers"] = list(tiers)
    if alert_policy is not None:
        document["alert_policy"] = alert_policy
    return yaml.safe_dump(document, sort_keys=False)


def spec(*tiers: dict[str, Any], **options: Any) -> SLOSpec:
    """The parsed spec of `spec_yaml(*tiers, **options)`."""
    return SLOSpec.from_yaml(spec_yaml(*tiers, **options), source="test spec")


def premium_batch_spec(premium_objectives: str, batch_objectives: str = "p99 e2e <= 30s") -> str:
    """SLO spec YAML: premium (priority 0) and batch (priority 2, the default tier), matched on
    `x-llm-tier`; objectives as the spec writes them, comma-separated."""
    return spec_yaml(
        make_tier("premium", *_split(premium_objectives), priority=0),
        make_tier(
            "batch",
            *_split(batch_objectives),
            priority=2,
            default=True,
            match=header_match("batch"),
        ),
    )


def every_tier_spec(tiers: Iterable[str], *objectives: str) -> str:
    """The same objectives for each of `tiers` (the first is the default), judged from the
    first request on (min_events 1): a verdict for whatever a run holds."""
    names = sorted(tiers)
    return spec_yaml(
        *(make_tier(name, *objectives, default=index == 0) for index, name in enumerate(names)),
        min_events=1,
    )


def _split(objectives: str) -> list[str]:
    return [part.strip() for part in objectives.split(",") if part.strip()]
