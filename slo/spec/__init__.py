"""The SLO spec: tiers, their match rules and objectives, the window and the alert policy.

Loaded from YAML (ours, or OpenSLO v1 documents converted by `slo.spec.openslo`) and validated
with errors of the form `slo.yaml:14: tier 'gold': <what is wrong>; <fix>`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import yaml

from slo.errors import SpecError
from slo.spec.alert_policy import (
    DEFAULT_BURN_RATES,
    DEFAULT_THRESHOLD_ALERTS,
    AlertPolicy,
    BurnRateRule,
    ThresholdAlert,
    build_alert_policy,
)
from slo.spec.fields import (
    DEFAULT_WINDOW_S,
    Fail,
    check_keys,
    count,
    duration,
    line_of,
)
from slo.spec.match import OBJECTIVE_HEADER, MatchRule, build_match, header_value, objective_name
from slo.spec.objectives import Objective, parse_objective
from slo.spec.openslo import openslo_to_spec_dict
from slo.spec.yamlfile import error_line, error_problem, load_documents
from slo.units import format_duration

_TIER_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_TOP_KEYS = ("version", "window", "min_events", "tiers", "alert_policy", "objective_header")
_TIER_KEYS = ("name", "priority", "default", "match", "objectives", "description")


@dataclass(frozen=True, slots=True)
class Tier:
    name: str
    priority: int
    match: MatchRule
    objectives: tuple[Objective, ...]
    default: bool = False
    description: str = ""
    line: int = 0

    @property
    def objective_names(self) -> tuple[str, ...]:
        """The InferenceObjective names that mean this tier in the objective header."""
        return self.match.objectives or (objective_name(self.name),)

    @property
    def latency_objectives(self) -> tuple[Objective, ...]:
        return tuple(o for o in self.objectives if o.kind == "latency")


@dataclass(frozen=True)
class SLOSpec:
    tiers: list[Tier]
    window_s: float = DEFAULT_WINDOW_S
    alert_policy: AlertPolicy = field(default_factory=AlertPolicy)
    # Below this many events an objective's verdict is "insufficient_data".
    min_events: int = 1
    source: str = "slo.yaml"
    notes: tuple[str, ...] = ()
    # The header naming a Gateway API Inference Extension InferenceObjective (None: not read).
    objective_header: str | None = OBJECTIVE_HEADER

    @classmethod
    def load(cls, path: str | Path) -> SLOSpec:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise SpecError(str(path), 0, "file not found; `slo init` writes an example") from None
        except (OSError, UnicodeDecodeError) as error:
            raise SpecError(str(path), 0, f"cannot read the file ({error})") from None
        return cls.from_yaml(text, source=str(path))

    @classmethod
    def from_yaml(cls, text: str, source: str = "slo.yaml") -> SLOSpec:
        try:
            documents = [doc for doc in load_documents(text) if doc is not None]
        except yaml.YAMLError as error:
            raise SpecError(
                source,
                error_line(error),
                f"invalid YAML: {error_problem(error)}; "
                "check the indentation and quoting on that line",
            ) from None
        if any(
            isinstance(doc, Mapping) and str(doc.get("apiVersion", "")).startswith("openslo/")
            for doc in documents
        ):
            try:
                raw, notes = openslo_to_spec_dict(documents, source)
            except (ValueError, TypeError, AttributeError, KeyError, IndexError) as error:
                raise SpecError(
                    source,
                    0,
                    f"OpenSLO document not understood ({error}); see slo/examples/openslo.yaml",
                ) from None
            return _build(raw, source, notes)
        if len(documents) != 1:
            raise SpecError(
                source,
                0,
                f"expected one YAML document, found {len(documents)}; keep one spec per file",
            )
        return _build(documents[0], source, ())

    @classmethod
    def default(cls) -> SLOSpec:
        """The packaged example (`slo/examples/slo.yaml`), the spec every command defaults to."""
        return cls.from_yaml(example_text(), source="slo/examples/slo.yaml")

    @property
    def default_tier(self) -> Tier:
        return next(tier for tier in self.tiers if tier.default)

    def tier(self, name: str) -> Tier:
        for tier in self.tiers:
            if tier.name == name:
                return tier
        raise KeyError(name)

    def resolve_tier(
        self, headers: Mapping[str, str], route: str, api_key_id: str | None = None
    ) -> Tier:
        """The first tier (in spec order) whose match rule accepts the request, or whose
        InferenceObjective names the objective header holds, else the default."""
        named = header_value(headers, self.objective_header) if self.objective_header else None
        for tier in self.tiers:
            if tier.match.matches(headers, route, api_key_id) or (
                named is not None and named in tier.objective_names
            ):
                return tier
        return self.default_tier

    def thresholds_for(self, sli_name: str) -> set[float]:
        return {
            o.threshold_s
            for tier in self.tiers
            for o in tier.objectives
            if o.sli == sli_name and o.threshold_s is not None
        }

    def to_dict(self) -> dict[str, Any]:
        """The normalized spec: canonical objective spellings, every default written out."""
        return {
            "version": 1,
            "window": format_duration(self.window_s),
            "min_events": self.min_events,
            "objective_header": self.objective_header,
            "tiers": [
                {
                    "name": tier.name,
                    "priority": tier.priority,
                    "default": tier.default,
                    **({"description": tier.description} if tier.description else {}),
                    "match": tier.match.to_dict(),
                    "objectives": [o.name for o in tier.objectives],
                }
                for tier in self.tiers
            ],
            "alert_policy": self.alert_policy.to_dict(),
        }


def example_text() -> str:
    return resources.files("slo").joinpath("examples/slo.yaml").read_text(encoding="utf-8")


# --- building and validation ---------------------------------------------------------------


def _build(raw: object, source: str, notes: tuple[str, ...]) -> SLOSpec:
    def fail(line: int, message: str, tier: str | None = None) -> NoReturn:
        raise SpecError(source, line, message, tier)

    if not isinstance(raw, Mapping):
        fail(
            line_of(raw, 0), "the spec must be a mapping with a 'tiers' list; `slo init` writes one"
        )
    assert isinstance(raw, Mapping)
    check_keys(raw, _TOP_KEYS, "top-level", fail)
    if raw.get("version", 1) != 1:
        fail(
            line_of(raw, "version"), f"version {raw['version']!r} is not supported; use version: 1"
        )
    window_s = duration(raw, "window", DEFAULT_WINDOW_S, fail)
    min_events = count(raw, "min_events", 1, fail, minimum=1)
    tiers_raw = raw.get("tiers")
    if not isinstance(tiers_raw, list) or not tiers_raw:
        fail(
            line_of(raw, "tiers"),
            "'tiers' must be a non-empty list; add e.g. "
            "'tiers: [{name: standard, default: true, objectives: [p95 ttft <= 500ms]}]'",
        )
    assert isinstance(tiers_raw, list)
    tiers = [
        _build_tier(item, index, line_of(tiers_raw, index), source)
        for index, item in enumerate(tiers_raw)
    ]
    first_line: dict[str, int] = {}
    for tier in tiers:
        if tier.name in first_line:
            fail(
                tier.line,
                f"duplicate tier (first defined on line {first_line[tier.name]}); "
                "rename one or merge their objectives",
                tier.name,
            )
        first_line[tier.name] = tier.line
    defaults = [tier for tier in tiers if tier.default]
    if len(defaults) > 1:
        fail(
            defaults[1].line,
            f"a second default tier (tier {defaults[0].name!r} on line "
            f"{defaults[0].line} is default too); keep 'default: true' on one tier only",
            defaults[1].name,
        )
    if not defaults:
        if len(tiers) > 1:
            fail(
                line_of(raw, "tiers"),
                "no tier has 'default: true'; mark the tier that unmatched requests fall into",
            )
        tiers[0] = _replace_default(tiers[0])
    policy = build_alert_policy(raw.get("alert_policy"), line_of(raw, "alert_policy"), fail)
    header = _objective_header(raw, fail)
    return SLOSpec(tiers, window_s, policy, min_events, source, notes, header)


def _objective_header(raw: Mapping[str, Any], fail: Fail) -> str | None:
    """The header naming an InferenceObjective: the Inference Extension's unless the spec
    names another, or null for none."""
    header = raw.get("objective_header", OBJECTIVE_HEADER)
    if header is not None and (not isinstance(header, str) or not header.strip()):
        fail(
            line_of(raw, "objective_header"),
            f"objective_header {header!r} must be a header name, or null to read none",
        )
    return header.strip().lower() if isinstance(header, str) else None


def _replace_default(tier: Tier) -> Tier:
    return Tier(
        tier.name, tier.priority, tier.match, tier.objectives, True, tier.description, tier.line
    )


def _build_tier(raw: object, index: int, line: int, source: str) -> Tier:
    def fail(at: int, message: str) -> NoReturn:
        raise SpecError(source, at, message)

    if not isinstance(raw, Mapping):
        fail(line, f"tier #{index + 1} must be a mapping with 'name' and 'objectives'")
    assert isinstance(raw, Mapping)
    name = raw.get("name")
    if not isinstance(name, str) or not _TIER_NAME.match(name):
        fail(
            line_of(raw, "name"),
            f"tier #{index + 1} needs a 'name' of lowercase letters, digits, "
            f"'-' or '_' (got {name!r})",
        )
    assert isinstance(name, str)

    def tier_fail(at: int, message: str) -> NoReturn:
        raise SpecError(source, at, message, name)

    check_keys(raw, _TIER_KEYS, "tier", tier_fail)
    priority = raw.get("priority", index)
    if isinstance(priority, bool) or not isinstance(priority, int):
        tier_fail(
            line_of(raw, "priority"),
            f"priority {priority!r} must be a whole number (0 is served first)",
        )
    default = raw.get("default", False)
    if not isinstance(default, bool):
        tier_fail(line_of(raw, "default"), f"'default' must be true or false, got {default!r}")
    match = build_match(raw.get("match"), name, line_of(raw, "match"), tier_fail)
    objectives = _build_objectives(raw, tier_fail)
    description = str(raw.get("description", ""))
    return Tier(name, int(priority), match, objectives, default, description, line)


def _build_objectives(raw: Mapping[str, Any], fail: Fail) -> tuple[Objective, ...]:
    """A tier's objectives: each parsed, none repeated, a goodput one beside a latency one."""
    objectives_raw = raw.get("objectives")
    if not isinstance(objectives_raw, list) or not objectives_raw:
        fail(
            line_of(raw, "objectives"),
            "has no objectives; add e.g. 'objectives: [p95 ttft <= 500ms]'",
        )
    assert isinstance(objectives_raw, list)
    objectives: list[Objective] = []
    seen: dict[str, int] = {}
    for position, item in enumerate(objectives_raw):
        at = line_of(objectives_raw, position)
        try:
            objective = parse_objective(item, at)
        except ValueError as error:
            fail(at, str(error))
        if objective.name in seen:
            fail(
                at, f"objective {objective.name!r} repeats line {seen[objective.name]}; remove one"
            )
        seen[objective.name] = at
        objectives.append(objective)
    if any(o.kind == "goodput" for o in objectives) and not any(
        o.kind == "latency" for o in objectives
    ):
        fail(
            line_of(raw, "objectives"),
            "a goodput objective needs at least one latency "
            "objective to define a good request; add e.g. 'p95 ttft <= 500ms'",
        )
    return tuple(objectives)


__all__ = [
    "DEFAULT_BURN_RATES",
    "DEFAULT_THRESHOLD_ALERTS",
    "OBJECTIVE_HEADER",
    "AlertPolicy",
    "BurnRateRule",
    "MatchRule",
    "SLOSpec",
    "SpecError",
    "ThresholdAlert",
    "Tier",
]
