"""Import OpenSLO v1 documents (kind SLO, with an inline or referenced kind SLI) into our spec.

How an OpenSLO objective becomes ours:
- thresholdMetric whose query names one of our latency metrics (e.g.
  llm_slo_time_to_first_token_seconds) with `op: lte|lt` and `value` (seconds, the metric's
  unit): "target of requests <sli> <= value".
- ratioMetric whose good (or bad) query selects a histogram bucket of one of our latency
  metrics (`..._bucket{le="0.5"}`): the same, with the bucket bound as threshold.
- any other ratioMetric (e.g. docs/slo-spec.md's 2xx over all requests) is read as availability;
  a note says so.
The tier comes from `metadata.labels.tier` (default: one tier named "default"); the window
from the rolling `timeWindow`, one for the whole file. Timeslices budgeting is refused: we count
events. What else is refused, and why, is in `slo.spec.openslo_fields`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from slo.errors import SpecError, UsageError
from slo.sli import CATALOG, LATENCY_SLIS
from slo.spec.fields import DEFAULT_WINDOW_S
from slo.spec.openslo_fields import (
    SloWindow,
    check_kinds,
    check_objective,
    check_slo_spec,
    one_window,
    read_window,
)
from slo.units import format_duration, format_percent

_METRIC_TO_SLI = {CATALOG[name].metric: name for name in LATENCY_SLIS}
_METRIC_NAME = re.compile(r"llm_slo_[a-z_]+")
_LE = re.compile(r"""le\s*=~?\s*["']([0-9.eE+-]+)["']""")


def _fail(source: str, doc: Any, message: str) -> UsageError:
    return SpecError(source, int(getattr(doc, "line", 0)), f"OpenSLO: {message}")


def openslo_to_spec_dict(
    documents: Sequence[Any], source: str
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Our spec's raw dict (validated afterwards like any spec) and notes on the reading."""
    documents = [doc for doc in documents if isinstance(doc, Mapping)]
    slis = {
        str(doc.get("metadata", {}).get("name")): doc.get("spec", {})
        for doc in documents
        if doc.get("kind") == "SLI"
    }
    slos = [doc for doc in documents if doc.get("kind") == "SLO"]
    if not slos:
        raise _fail(
            source,
            documents[0] if documents else None,
            "no document of kind SLO; add one (apiVersion: openslo/v1, kind: SLO)",
        )
    check_kinds(documents, source)
    notes: list[str] = []
    tiers: dict[str, list[str]] = {}
    windows: list[SloWindow] = []
    unwindowed: list[str] = []
    for slo in slos:
        spec = slo.get("spec") or {}
        name = str((slo.get("metadata") or {}).get("name", "slo"))
        check_slo_spec(spec, source, name)
        method = spec.get("budgetingMethod", "Occurrences")
        if method != "Occurrences":
            raise _fail(
                source,
                slo,
                f"SLO {name!r}: budgetingMethod {method!r} is not supported; "
                "use Occurrences (llm-slo counts events, not time slices)",
            )
        window = read_window(spec, source, name)
        if window is None:
            unwindowed.append(name)
        else:
            windows.append(window)
        indicator = _indicator(spec, slis, source, slo, name)
        tier = _tier_label(slo)
        for index, objective in enumerate(spec.get("objectives") or []):
            check_objective(objective, index, source, name)
            text, note = _objective(objective, indicator, source, slo, name)
            tiers.setdefault(tier, []).append(text)
            if note:
                notes.append(note)
    default_tier = "default" if "default" in tiers else next(iter(tiers))
    raw: dict[str, Any] = {
        "tiers": [
            {"name": tier, "default": tier == default_tier, "objectives": objectives}
            for tier, objectives in tiers.items()
        ]
    }
    window_s, window_notes = one_window(windows, unwindowed, source, DEFAULT_WINDOW_S)
    if window_s is not None:
        raw["window"] = format_duration(window_s)
    return raw, (*notes, *window_notes)


def _indicator(
    spec: Mapping[str, Any], slis: Mapping[str, Any], source: str, doc: Any, name: str
) -> Mapping[str, Any]:
    if "indicator" in spec:
        return (spec["indicator"] or {}).get("spec") or {}
    reference = spec.get("indicatorRef")
    if reference is None:
        raise _fail(source, doc, f"SLO {name!r} has neither indicator nor indicatorRef")
    if str(reference) not in slis:
        raise _fail(
            source,
            doc,
            f"SLO {name!r}: indicatorRef {reference!r} names no SLI "
            "document in this file; add the kind: SLI document",
        )
    return slis[str(reference)] or {}


def _tier_label(doc: Mapping[str, Any]) -> str:
    labels = (doc.get("metadata") or {}).get("labels") or {}
    tier = labels.get("tier", "default") if isinstance(labels, Mapping) else "default"
    if isinstance(tier, list):
        tier = tier[0] if tier else "default"
    return str(tier)


def _queries(node: Any) -> list[str]:
    """Every string under a metric source's spec (query, promql, ... whatever the vendor uses)."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, Mapping):
        return [text for value in node.values() for text in _queries(value)]
    if isinstance(node, list):
        return [text for value in node for text in _queries(value)]
    return []


def _latency_sli(texts: list[str]) -> str | None:
    for text in texts:
        for metric in _METRIC_NAME.findall(text):
            base = re.sub(r"_(bucket|count|sum)$", "", metric)
            if base in _METRIC_TO_SLI:
                return _METRIC_TO_SLI[base]
    return None


def _target(objective: Mapping[str, Any], source: str, doc: Any, name: str) -> float:
    if "target" in objective:
        target = float(objective["target"])
    elif "targetPercent" in objective:
        target = float(objective["targetPercent"]) / 100.0
    else:
        raise _fail(source, doc, f"SLO {name!r}: objective needs target or targetPercent")
    if not 0.0 < target < 1.0:
        raise _fail(source, doc, f"SLO {name!r}: target {target} must be in (0, 1)")
    return target


def _objective(
    objective: Mapping[str, Any], indicator: Mapping[str, Any], source: str, doc: Any, name: str
) -> tuple[str, str | None]:
    target = format_percent(_target(objective, source, doc, name))
    if "thresholdMetric" in indicator:
        sli = _latency_sli(_queries(indicator["thresholdMetric"]))
        if sli is None:
            raise _fail(
                source,
                doc,
                f"SLO {name!r}: cannot tell which SLI the thresholdMetric "
                "measures; name an llm_slo_ latency metric in its query, e.g. "
                "llm_slo_time_to_first_token_seconds",
            )
        op = {"lte": "<=", "lt": "<"}.get(str(objective.get("op", "lte")))
        if op is None or "value" not in objective:
            raise _fail(
                source,
                doc,
                f"SLO {name!r}: a latency objective needs op lte or lt and a value in seconds",
            )
        threshold = format_duration(float(objective["value"]))
        return f"{target} of requests {sli} {op} {threshold}", None
    ratio = indicator.get("ratioMetric")
    if not isinstance(ratio, Mapping):
        raise _fail(
            source, doc, f"SLO {name!r}: the indicator has neither ratioMetric nor thresholdMetric"
        )
    good_texts = _queries(ratio.get("good") or ratio.get("bad") or {})
    sli = _latency_sli(good_texts)
    bound = next((m.group(1) for text in good_texts if (m := _LE.search(text))), None)
    if sli is not None and bound is not None:
        return f"{target} of requests {sli} <= {format_duration(float(bound))}", None
    note = (
        f"OpenSLO SLO {name!r}: ratio of {'bad' if 'bad' in ratio else 'good'} to total "
        "events read as availability (good = requests with outcome ok)"
    )
    return f"availability >= {target}", note
