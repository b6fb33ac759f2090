"""Which requests belong to a tier: its match rule (a header's values, API keys, routes, and the
Gateway API Inference Extension's InferenceObjective names) and how the spec reads one."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slo.spec.fields import Fail, line_of, optional_section, strings

MATCH_KEYS = ("header", "values", "api_keys", "routes", "objectives")
# The header the Gateway API Inference Extension's gateway reads: the InferenceObjective's name.
OBJECTIVE_HEADER = "x-gateway-inference-objective"


def header_value(headers: Mapping[str, str], name: str) -> str | None:
    """A header's value, its name matched case-insensitively (`name` in lower case)."""
    value = headers.get(name)
    if value is None:  # plain dicts are case-sensitive; HTTP header names are not
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    return None if value is None else value.strip()


def objective_name(tier_name: str) -> str:
    """The InferenceObjective a tier is named by unless its match rule names others: a
    Kubernetes object name (no '_')."""
    return tier_name.replace("_", "-")


@dataclass(frozen=True, slots=True)
class MatchRule:
    """Which requests belong to a tier: any one criterion matching is enough. `objectives`
    are the InferenceObjective names that mean this tier (none given: the tier's own name,
    `Tier.objective_names`), read from the spec's objective header by `SLOSpec.resolve_tier`."""

    header: str | None = None
    values: tuple[str, ...] = ()
    api_keys: tuple[str, ...] = ()
    routes: tuple[str, ...] = ()
    objectives: tuple[str, ...] = ()

    def matches(self, headers: Mapping[str, str], route: str, api_key_id: str | None) -> bool:
        if api_key_id is not None and api_key_id in self.api_keys:
            return True
        if self.header is not None and header_value(headers, self.header) in self.values:
            return True
        return any(_route_matches(pattern, route) for pattern in self.routes)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.header is not None:
            out["header"], out["values"] = self.header, list(self.values)
        if self.api_keys:
            out["api_keys"] = list(self.api_keys)
        if self.routes:
            out["routes"] = list(self.routes)
        if self.objectives:
            out["objectives"] = list(self.objectives)
        return out


def _route_matches(pattern: str, route: str) -> bool:
    """Glob when the pattern has wildcards, else a path prefix ('/v1/chat' matches '/v1/chat/x')."""
    if any(char in pattern for char in "*?["):
        return fnmatch.fnmatchcase(route, pattern)
    return route == pattern or route.startswith(pattern.rstrip("/") + "/")


def build_match(raw: object, tier_name: str, line: int, fail: Fail) -> MatchRule:
    raw = optional_section(
        raw, line, "match", MATCH_KEYS, "header/values, api_keys, routes or objectives", fail
    )
    if raw is None:
        return MatchRule()
    header = raw.get("header")
    if header is not None and (not isinstance(header, str) or not header.strip()):
        fail(
            line_of(raw, "header"),
            f"match header {header!r} must be a header name, e.g. x-llm-tier",
        )
    if "values" in raw and header is None:
        fail(line_of(raw, "values"), "'values' needs 'header' naming the header to read")
    values = strings(raw, "values", fail) or ((tier_name,) if header else ())
    routes = strings(raw, "routes", fail)
    for position, route in enumerate(routes):
        if not route.startswith("/"):
            fail(line_of(raw.get("routes"), position), f"route {route!r} must start with '/'")
    return MatchRule(
        header.strip().lower() if isinstance(header, str) else None,
        values,
        strings(raw, "api_keys", fail),
        routes,
        strings(raw, "objectives", fail),
    )
