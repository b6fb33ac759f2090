"""OpenSLO v1 files: what maps onto our spec is mapped, what we cannot honour is refused with
the field's path, the SLO, the file and line, and the fix; nothing is dropped without a word.

The documents follow the OpenSLO v1 README (github.com/OpenSLO/OpenSLO): SLO with
timeWindow, alertPolicies (by reference or inline) and objectives, and kind AlertPolicy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slo.spec import SLOSpec, SpecError

REPO = Path(__file__).resolve().parents[3]

SLI = """\
apiVersion: openslo/v1
kind: SLI
metadata:
  name: ttft
spec:
  thresholdMetric:
    metricSource:
      type: Prometheus
      spec:
        query: llm_slo_time_to_first_token_seconds_bucket
"""


def slo_document(
    name: str, window: str, extra: str = "", objective: str = "", value: float = 0.5
) -> str:
    """An SLO on the `ttft` SLI, `value` seconds at 95%; `window`: the timeWindow's YAML lines
    (indented 4), or ''; `extra`: more spec lines, `objective`: more objective lines."""
    return f"""\
---
apiVersion: openslo/v1
kind: SLO
metadata:
  name: {name}
spec:
  service: chat
  indicatorRef: ttft
  budgetingMethod: Occurrences
{"  timeWindow:" + chr(10) + window if window else ""}{extra}  objectives:
    - op: lte
      value: {value}
      target: 0.95
{objective}"""


ROLLING_28D = "    - duration: 28d\n      isRolling: true\n"


def load(*documents: str) -> SLOSpec:
    return SLOSpec.from_yaml(SLI + "".join(documents), source="chat.yaml")


def refusal(*documents: str) -> str:
    with pytest.raises(SpecError) as caught:
        load(*documents)
    message = str(caught.value)
    assert message.startswith("chat.yaml:") and "\n" not in message, message
    return message


def line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


ALERT_POLICY_REF = "  alertPolicies:\n    - alertPolicyRef: default\n"
ALERT_POLICY_INLINE = """\
  alertPolicies:
    - kind: AlertPolicy
      metadata:
        name: fast-burn
      spec:
        alertWhenBreaching: true
        conditions:
          - kind: AlertCondition
            metadata:
              name: burn
            spec:
              severity: page
              condition: {kind: burnrate, op: gte, threshold: 14.4, lookbackWindow: 1h,
                          alertAfter: 5m}
        notificationTargets:
          - targetRef: on-call
"""


@pytest.mark.parametrize("policies", [ALERT_POLICY_REF, ALERT_POLICY_INLINE])
def test_alert_policies_are_refused_with_the_field_and_the_fix(policies: str) -> None:
    document = slo_document("chat-ttft", ROLLING_28D, policies)
    message = refusal(document)
    assert f"chat.yaml:{line_of(SLI + document, 'alertPolicies:')}:" in message
    assert "SLO 'chat-ttft': spec.alertPolicies is not read" in message
    assert "remove it" in message and "`slo lint chat.yaml > slo.yaml`" in message


def test_an_alert_policy_document_is_refused_by_kind_and_name() -> None:
    policy = """\
---
apiVersion: openslo/v1
kind: AlertPolicy
metadata:
  name: default
spec:
  alertWhenBreaching: true
  conditions:
    - conditionRef: cpu-usage-breach
  notificationTargets:
    - targetRef: on-call
"""
    message = refusal(slo_document("chat-ttft", ROLLING_28D), policy)
    assert "kind AlertPolicy 'default' is not read" in message and "alert_policy" in message


def test_an_empty_alert_policy_list_asks_for_nothing() -> None:
    spec = load(slo_document("chat-ttft", ROLLING_28D, "  alertPolicies: []\n"))
    assert spec.window_s == 28 * 86400


CALENDAR = (
    "    - duration: 1M\n      calendar:\n        startTime: 2022-01-01 12:00:00\n"
    "        timeZone: America/New_York\n"
)


@pytest.mark.parametrize(
    ("window", "field"),
    [
        (CALENDAR, "calendar"),
        (CALENDAR + "      isRolling: false\n", "calendar"),
        ("    - duration: 7d\n      isRolling: false\n", "isRolling"),
    ],
)
def test_calendar_windows_are_refused(window: str, field: str) -> None:
    document = slo_document("chat-ttft", window)
    message = refusal(document)
    assert f"chat.yaml:{line_of(SLI + document, field + ':')}:" in message
    assert f"SLO 'chat-ttft': spec.timeWindow[0] is calendar-aligned ({field})" in message
    assert "isRolling: true" in message


@pytest.mark.parametrize(
    ("duration", "seconds", "note"),
    [("28d", 28 * 86400, None), ("1w", 7 * 86400, None), ("1M", 30 * 86400, "1M read as")],
)
def test_a_rolling_window_becomes_the_specs_window(
    duration: str, seconds: float, note: str | None
) -> None:
    spec = load(slo_document("chat-ttft", f"    - duration: {duration}\n      isRolling: true\n"))
    assert spec.window_s == seconds
    assert any(note in n for n in spec.notes) if note else not spec.notes


def test_slos_with_different_windows_are_refused_naming_both() -> None:
    first = slo_document("chat-ttft", ROLLING_28D)
    second = slo_document("batch-ttft", "    - duration: 7d\n      isRolling: true\n", value=2)
    message = refusal(first, second)
    assert "SLO 'batch-ttft': spec.timeWindow 1w differs from the 4w of SLO 'chat-ttft'" in message
    assert "one window" in message


def test_an_slo_without_a_window_is_judged_over_the_files_and_says_so() -> None:
    spec = load(slo_document("chat-ttft", ROLLING_28D), slo_document("lone", "", value=2))
    assert spec.window_s == 28 * 86400
    assert any("'lone' has no spec.timeWindow; judged over 4w" in n for n in spec.notes)
    alone = load(slo_document("lone", ""))
    assert any("judged over 30d (llm-slo's default)" in n for n in alone.notes)


@pytest.mark.parametrize(
    ("objective", "expected"),
    [
        (
            "      timeSliceTarget: 0.9\n",
            "spec.objectives[0].timeSliceTarget belongs to Timeslices",
        ),
        ("      timeSliceWindow: 1m\n", "spec.objectives[0].timeSliceWindow belongs to Timeslices"),
        ("      targetPercent: 95\n", "spec.objectives[0] has both target and targetPercent"),
        ("      weight: 2\n", "spec.objectives[0].weight is not an OpenSLO v1 objective field"),
    ],
)
def test_objective_fields_we_cannot_honour_are_refused(objective: str, expected: str) -> None:
    message = refusal(slo_document("chat-ttft", ROLLING_28D, objective=objective))
    assert f"SLO 'chat-ttft': {expected}" in message


def test_an_unknown_slo_field_is_refused() -> None:
    message = refusal(slo_document("chat-ttft", ROLLING_28D, "  budgetAdjustments: []\n"))
    assert "SLO 'chat-ttft': spec.budgetAdjustments is not an OpenSLO v1 SLO field" in message


@pytest.mark.parametrize("command", ["lint", "check"])
def test_lint_and_check_print_the_refusal_as_one_line(tmp_path: Path, command: str) -> None:
    spec = tmp_path / "chat.yaml"
    spec.write_text(SLI + slo_document("chat-ttft", ROLLING_28D, ALERT_POLICY_REF))
    args = [str(spec)] if command == "lint" else ["--spec", str(spec), "--results", "none.jsonl"]
    result = subprocess.run(
        [sys.executable, "-m", "slo.cli", command, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{spec}:" in lines[0] and "spec.alertPolicies" in lines[0], lines[0]
