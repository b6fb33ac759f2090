"""Objectives and the grammar people write them in.

Four kinds, each with a canonical one-line spelling that `to_dict` writes back:

    p95 ttft <= 200ms                  percentile form
    99% of requests e2e <= 30s         ratio form (the same objective as "p99 e2e <= 30s")
    availability >= 99.9%              ok / (all - client_error - cancelled)
    goodput >= 95%                     a request is good only if it meets every latency
                                       objective of its tier (vllm bench serve's goodput)
    throughput >= 500 tokens/s         output tokens per second over the evaluated span

A percentile objective "pQ x <= T" and a ratio objective "Q% of requests x <= T" are the same
statement when percentiles are nearest-rank (the value of a real request): the Q-th percentile
is at most T exactly when at least Q% of requests are at most T.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from slo.sli import CATALOG, LATENCY_SLIS
from slo.units import format_duration, format_percent, parse_duration, parse_fraction

ObjectiveKind = Literal["latency", "availability", "goodput", "throughput"]
Form = Literal["percentile", "ratio"]

_PERCENTILE = re.compile(
    r"^p(?P<q>\d+(?:\.\d+)?)\s+(?P<sli>[A-Za-z_]\w*)\s*(?P<op><=|<)\s*(?P<t>.+)$"
)
_RATIO = re.compile(
    r"^(?P<q>\d+(?:\.\d+)?)\s*%\s+(?:of\s+(?:requests|tokens|gaps)\s+)?"
    r"(?P<sli>[A-Za-z_]\w*)\s*(?P<op><=|<)\s*(?P<t>.+)$"
)
_TARGET = re.compile(r"^(?P<kind>availability|goodput)\s*>=\s*(?P<target>.+)$")
_THROUGHPUT = re.compile(r"^throughput\s*>=\s*(?P<rate>\d+(?:\.\d+)?)\s*(?P<unit>\S*)$")
_THROUGHPUT_UNITS = ("tokens/s", "tok/s")

EXAMPLES = "'p95 ttft <= 200ms', '99% of requests e2e <= 30s', 'availability >= 99.9%'"


@dataclass(frozen=True, slots=True)
class Objective:
    """One objective of one tier. `target` is the fraction of events that must be good."""

    kind: ObjectiveKind
    target: float
    sli: str | None = None
    threshold_s: float | None = None
    inclusive: bool = True
    form: Form = "percentile"
    min_tokens_per_s: float | None = None
    line: int = 0

    @property
    def name(self) -> str:
        """The canonical spelling, also the objective's id in reports."""
        if self.kind == "latency":
            op = "<=" if self.inclusive else "<"
            threshold = format_duration(self.threshold_s or 0.0)
            if self.form == "percentile":
                return f"p{format_percent(self.target)[:-1]} {self.sli} {op} {threshold}"
            events = "gaps" if self.sli == "itl" else "requests"
            return f"{format_percent(self.target)} of {events} {self.sli} {op} {threshold}"
        if self.kind == "throughput":
            return f"throughput >= {self.min_tokens_per_s:g} tokens/s"
        return f"{self.kind} >= {format_percent(self.target)}"

    @property
    def indicator(self) -> str:
        """What it judges, as the `sli` label of its records and alerts says: its catalog
        SLI, or `availability` or `goodput`."""
        return self.sli or self.kind

    @property
    def percentile(self) -> float:
        """The percentile (0..100) whose value is compared with the threshold."""
        return self.target * 100.0

    @property
    def has_error_budget(self) -> bool:
        return self.kind != "throughput"


def parse_objective(item: object, line: int) -> Objective:
    """A string or mapping from the spec -> Objective. Raises ValueError saying how to fix."""
    if isinstance(item, str):
        return _parse_text(" ".join(item.split()), line)
    if isinstance(item, Mapping):
        return _parse_mapping(item, line)
    raise ValueError(f"objective {item!r} is neither text nor a mapping; write e.g. {EXAMPLES}")


def _parse_text(text: str, line: int) -> Objective:
    if match := _PERCENTILE.match(text):
        quantile = _quantile(match["q"], text)
        return _latency(match["sli"], quantile, match["op"], match["t"], "percentile", line)
    if match := _RATIO.match(text):
        quantile = _quantile(match["q"], text)
        return _latency(match["sli"], quantile, match["op"], match["t"], "ratio", line)
    if match := _TARGET.match(text):
        kind: ObjectiveKind = "availability" if match["kind"] == "availability" else "goodput"
        return Objective(kind, parse_fraction(match["target"].strip()), line=line)
    if match := _THROUGHPUT.match(text):
        return _throughput(match["rate"], match["unit"], text, line)
    raise ValueError(f"cannot read objective {text!r}; write it like {EXAMPLES}")


def _parse_mapping(item: Mapping[object, object], line: int) -> Objective:
    known = {"sli", "percentile", "target", "threshold", "op", "availability", "goodput"}
    unknown = [str(key) for key in item if key not in known]
    if unknown:
        raise ValueError(f"unknown objective key {unknown[0]!r}; use {', '.join(sorted(known))}")
    for kind in ("availability", "goodput"):
        if kind in item:
            return Objective(kind, parse_fraction(item[kind]), line=line)  # type: ignore[arg-type]
    if "sli" not in item or "threshold" not in item:
        raise ValueError(
            "objective mapping needs 'sli' and 'threshold' (and 'percentile' or 'target')"
        )
    op = str(item.get("op", "<="))
    if "percentile" in item:
        quantile = _quantile(str(item["percentile"]).lstrip("p"), str(dict(item)))
        form: Form = "percentile"
    elif "target" in item:
        quantile, form = parse_fraction(item["target"]), "ratio"
    else:
        raise ValueError("objective mapping needs 'percentile: 95' or 'target: 95%'")
    return _latency(str(item["sli"]), quantile, op, item["threshold"], form, line)


def _quantile(digits: str, text: str) -> float:
    try:
        value = float(digits)
    except ValueError:
        raise ValueError(f"cannot read the percentile in {text!r}; write e.g. p95") from None
    if not 0.0 < value < 100.0:
        raise ValueError(f"percentile {digits} in {text!r} must be above 0 and below 100")
    return value / 100.0


def _latency(
    sli: str, quantile: float, op: str, threshold: object, form: Form, line: int
) -> Objective:
    check_latency_sli(sli)
    if op not in ("<=", "<"):
        raise ValueError(f"operator {op!r} is not supported for latency; use <= or <")
    threshold_text = threshold.strip() if isinstance(threshold, str) else threshold
    return Objective(
        "latency",
        quantile,
        sli=sli,
        threshold_s=parse_duration(threshold_text),
        inclusive=op == "<=",
        form=form,
        line=line,
    )


def _throughput(rate: str, unit: str, text: str, line: int) -> Objective:
    if unit not in _THROUGHPUT_UNITS:
        raise ValueError(
            f"throughput in {text!r} needs a unit; write e.g. 'throughput >= {rate} tokens/s'"
        )
    tokens_per_s = float(rate)
    if tokens_per_s <= 0:
        raise ValueError(f"throughput in {text!r} must be greater than zero")
    return Objective("throughput", 1.0, min_tokens_per_s=tokens_per_s, line=line)


def check_latency_sli(name: str) -> None:
    """Raise ValueError naming the right SLI when `name` cannot carry a latency objective."""
    if name in LATENCY_SLIS:
        return
    if name in CATALOG:
        sli = CATALOG[name]
        raise ValueError(
            f"SLI {name!r} is a {sli.kind} of {sli.unit}, not a latency; "
            f"latency objectives take one of {', '.join(LATENCY_SLIS)}"
        )
    close = difflib.get_close_matches(name, LATENCY_SLIS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ValueError(f"unknown SLI {name!r}; {hint}use one of {', '.join(LATENCY_SLIS)}")
