"""What of an OpenSLO v1 file llm-slo honours, and the refusal of the rest.

Nothing in an OpenSLO file is dropped quietly: a field is read (and mapped onto our spec), or
accepted because it only describes (`description`, `service`, `displayName`, documents of kind
Service and DataSource), or refused with its path and the fix. Refused:

- `spec.alertPolicies` and documents of kind AlertPolicy, AlertCondition and
  AlertNotificationTarget: our alerts are multi-window burn rates from the spec's
  `alert_policy`, which the generated rules, `/slo` and `slo check` judge alike.
- calendar-aligned windows (`calendar`, `isRolling: false`): every judge of ours reads a
  rolling window, the last N days up to now.
- SLOs of one file with different windows: a spec has one window.
- time-slice fields, `target` beside `targetPercent`, and any key OpenSLO v1 does not define.

A rolling window is mapped exactly; its calendar units (`1M`, `1Q`, `1Y`) are read as 30, 90 and
365 days, and a note says so, as it does for an SLO without a window.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slo.errors import SpecError
from slo.spec.fields import line_of
from slo.units import format_duration, parse_duration

SLO_SPEC_KEYS = (
    "description",
    "service",
    "indicator",
    "indicatorRef",
    "budgetingMethod",
    "timeWindow",
    "objectives",
    "alertPolicies",
)
OBJECTIVE_KEYS = ("displayName", "op", "value", "target", "targetPercent")
TIME_SLICE_KEYS = ("timeSliceTarget", "timeSliceWindow")
WINDOW_KEYS = ("duration", "isRolling", "calendar")
READ_KINDS = ("SLO", "SLI")
DESCRIPTIVE_KINDS = ("Service", "DataSource")
ALERTING_KINDS = ("AlertPolicy", "AlertCondition", "AlertNotificationTarget")
# OpenSLO's calendar units, as days; a rolling month is counted as 30 days.
CALENDAR_DAYS = {"M": 30, "Q": 90, "Y": 365}


def _alerts_fix(source: str) -> str:
    return (
        "llm-slo alerts on multi-window burn rates from its own alert_policy, which its rules, "
        "/slo and `slo check` judge alike; remove it, and to choose the alerts convert this "
        f"file (`slo lint {source} > slo.yaml`) and set alert_policy there (docs/slo-spec.md)"
    )


def refuse(source: str, line: int, message: str) -> SpecError:
    return SpecError(source, line, f"OpenSLO: {message}")


def check_kinds(documents: list[Mapping[str, Any]], source: str) -> None:
    """Every document is of a kind llm-slo reads or one that only describes."""
    for doc in documents:
        kind = doc.get("kind")
        if kind in READ_KINDS or kind in DESCRIPTIVE_KINDS:
            continue
        name = (doc.get("metadata") or {}).get("name", "")
        what = f"kind {kind} {str(name)!r}" if name else f"kind {kind!r}"
        if kind in ALERTING_KINDS:
            raise refuse(source, line_of(doc, "kind"), f"{what} is not read: {_alerts_fix(source)}")
        raise refuse(
            source,
            line_of(doc, "kind"),
            f"{what} is not a kind llm-slo reads; use SLO and SLI documents "
            f"({', '.join(DESCRIPTIVE_KINDS)} may stay, as descriptions) and remove it",
        )


def check_slo_spec(spec: Mapping[str, Any], source: str, name: str) -> None:
    """The keys of an SLO's `spec`: each one read, descriptive, or refused here."""
    for key in spec:
        if key not in SLO_SPEC_KEYS:
            raise refuse(
                source,
                line_of(spec, key),
                f"SLO {name!r}: spec.{key} is not an OpenSLO v1 SLO field llm-slo knows; "
                f"remove it (known: {', '.join(SLO_SPEC_KEYS)})",
            )
    if spec.get("alertPolicies"):  # an empty list asks for nothing
        raise refuse(
            source,
            line_of(spec, "alertPolicies"),
            f"SLO {name!r}: spec.alertPolicies is not read: {_alerts_fix(source)}",
        )


def check_objective(objective: Mapping[str, Any], index: int, source: str, name: str) -> None:
    where = f"SLO {name!r}: spec.objectives[{index}]"
    for key in objective:
        if key in TIME_SLICE_KEYS:
            raise refuse(
                source,
                line_of(objective, key),
                f"{where}.{key} belongs to Timeslices budgeting, which llm-slo does not read "
                "(it counts events); remove it",
            )
        if key not in OBJECTIVE_KEYS:
            raise refuse(
                source,
                line_of(objective, key),
                f"{where}.{key} is not an OpenSLO v1 objective field; remove it "
                f"(known: {', '.join(OBJECTIVE_KEYS)})",
            )
    if "target" in objective and "targetPercent" in objective:
        raise refuse(
            source,
            line_of(objective, "targetPercent"),
            f"{where} has both target and targetPercent; keep one",
        )


@dataclass(frozen=True, slots=True)
class SloWindow:
    """One SLO's rolling window, where it was written and a note on how it was read."""

    slo: str
    seconds: float
    line: int
    note: str | None = None


def read_window(spec: Mapping[str, Any], source: str, name: str) -> SloWindow | None:
    """The SLO's rolling `timeWindow` (None when it has none); calendar windows are refused."""
    if "timeWindow" not in spec:
        return None
    windows = spec["timeWindow"]
    at = line_of(spec, "timeWindow")
    if not isinstance(windows, list) or len(windows) != 1 or not isinstance(windows[0], Mapping):
        raise refuse(
            source,
            at,
            f"SLO {name!r}: spec.timeWindow must be a list of exactly one window "
            "(OpenSLO v1), e.g. [{duration: 28d, isRolling: true}]",
        )
    window: Mapping[str, Any] = windows[0]
    where = f"SLO {name!r}: spec.timeWindow[0]"
    for key in window:
        if key not in WINDOW_KEYS:
            raise refuse(
                source,
                line_of(window, key),
                f"{where}.{key} is not an OpenSLO v1 timeWindow field; use "
                f"{', '.join(WINDOW_KEYS)}",
            )
    rolling = window.get("isRolling", "calendar" not in window)  # OpenSLO's default
    if not isinstance(rolling, bool):
        raise refuse(
            source,
            line_of(window, "isRolling"),
            f"{where}.isRolling must be true or false, got {rolling!r}",
        )
    if not rolling or "calendar" in window:
        field = "calendar" if "calendar" in window else "isRolling"
        raise refuse(
            source,
            line_of(window, field),
            f"{where} is calendar-aligned ({field}): llm-slo judges a rolling window, the "
            "last N days up to now, in its rules, /slo and `slo check`; use `isRolling: true` "
            "and no calendar",
        )
    return _rolling(window, source, where, name)


def _rolling(window: Mapping[str, Any], source: str, where: str, name: str) -> SloWindow:
    at = line_of(window, "duration")
    text = str(window.get("duration", "")).strip()
    if not text:
        raise refuse(source, at, f"{where}.duration is missing; e.g. duration: 28d")
    note = None
    unit, count = text[-1:], text[:-1]
    if unit in CALENDAR_DAYS and count.isdigit():
        days = int(count) * CALENDAR_DAYS[unit]
        note = f"OpenSLO SLO {name!r}: spec.timeWindow duration {text} read as a rolling {days}d"
        text = f"{days}d"
    try:
        seconds = parse_duration(text)
    except ValueError as error:
        raise refuse(source, at, f"{where}.duration: {error}") from None
    return SloWindow(name, seconds, at, note)


def one_window(
    windows: list[SloWindow], unwindowed: list[str], source: str, default_s: float
) -> tuple[float | None, list[str]]:
    """The file's one window (None: the spec's default) and the notes on it; SLOs that
    disagree are refused, naming both."""
    notes = [w.note for w in windows if w.note]
    for window in windows[1:]:
        first = windows[0]
        if window.seconds != first.seconds:
            raise refuse(
                source,
                window.line,
                f"SLO {window.slo!r}: spec.timeWindow {format_duration(window.seconds)} differs "
                f"from the {format_duration(first.seconds)} of SLO {first.slo!r} (line "
                f"{first.line}): "
                "llm-slo judges every objective of a spec over one window; give both the same "
                "timeWindow, or put the SLOs of the other window in a file of their own",
            )
    seconds = windows[0].seconds if windows else None
    over = format_duration(seconds if seconds is not None else default_s)
    source_of = "the other SLOs' window" if windows else "llm-slo's default"
    notes.extend(
        f"OpenSLO SLO {name!r} has no spec.timeWindow; judged over {over} ({source_of})"
        for name in unwindowed
    )
    return seconds, notes
