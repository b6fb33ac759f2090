"""A burn-rate rule made wrong by hand fails the generated tests, which name it.

`write_alerts` writes the example spec's rules and tests, as `slo generate` does; the
burn-rate groups pass promtool on those rules, then fail on a copy where, by hand, a page's
factor is too low, a ticket's too high, a goodput ticket's too low, two pages swapped their
short windows and two others their long windows (labels left as they were: a rule that reads
right and is wrong). Each
failure names a broken alert, and every difference between what promtool expected and got
is a broken rule.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from alerts import RULES_FILE, RULES_TEST_FILE, write_alerts
from alerts.burn_tests import GROUP_PREFIX
from slo.spec import SLOSpec
from tests.helpers.binaries import binary

FAILURE = re.compile(r"alertname: (\w+), time: (\w+),")
LABELS = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class Swap:
    """In the rules of `alertname` for `tier` at `long`/`short`, `old` becomes `new` in the
    expression (a factor's limit, a window's records); each of `windows` once."""

    alertname: str
    tier: str
    windows: tuple[tuple[str, str], ...]  # (long, short) of each rule changed
    old: tuple[str, ...]  # per rule: the text to replace
    new: tuple[str, ...]  # per rule: what it becomes


BROKEN = (
    # premium's availability page at 10x, not 14.4x (limit 0.0144 of a 0.1% budget)
    Swap("LLMSLOAvailabilityBudgetBurn", "premium", (("1h", "5m"),), ("> 0.0144",), ("> 0.01",)),
    # standard's TPOT ticket at 4x, not 3x (limit 0.15 of a 5% budget)
    Swap("LLMSLOTPOTBudgetBurn", "standard", (("1d", "2h"),), ("> 0.15",), ("> 0.2",)),
    # premium's goodput ticket at 2x, not 3x (limit 0.15 of a 5% budget)
    Swap("LLMSLOGoodputBudgetBurn", "premium", (("1d", "2h"),), ("> 0.15",), ("> 0.1",)),
    # premium's TTFT pages with their short windows swapped: 1h/30m and 6h/5m
    Swap(
        "LLMSLOTTFTBudgetBurn",
        "premium",
        (("1h", "5m"), ("6h", "30m")),
        ("5m{", "30m{"),
        ("30m{", "5m{"),
    ),
    # batch's e2e pages with their long windows swapped: 6h/5m and 1h/30m
    Swap(
        "LLMSLOE2EBudgetBurn",
        "batch",
        (("1h", "5m"), ("6h", "30m")),
        ("1h{", "6h{"),
        ("6h{", "1h{"),
    ),
)


def _break(rules: dict[str, Any], swap: Swap) -> None:
    for (long, short), old, new in zip(swap.windows, swap.old, swap.new, strict=True):
        (rule,) = [
            rule
            for group in rules["groups"]
            for rule in group["rules"]
            if rule.get("alert") == swap.alertname
            and rule["labels"]["tier"] == swap.tier
            and (rule["labels"]["long_window"], rule["labels"]["short_window"]) == (long, short)
        ]
        assert old in rule["expr"], (swap, rule["expr"])
        rule["expr"] = rule["expr"].replace(old, new)


def _failures(report: str) -> list[tuple[str, str, set[tuple[str, str, str]]]]:
    """(alertname, time, the rules expected or got but not both) of each failure promtool
    reports; a rule is (tier, long_window, short_window)."""
    failures: list[tuple[str, str, set[tuple[str, str, str]]]] = []
    sides: dict[str, list[frozenset[tuple[str, str]]]] = {}
    side = "exp"
    for line in [*report.splitlines(), "alertname: end, time: 0,"]:
        if match := FAILURE.search(line):
            if failures:
                differ = set(sides.get("exp", [])) ^ set(sides.get("got", []))
                failures[-1][2].update(
                    (labels["tier"], labels["long_window"], labels["short_window"])
                    for labels in map(dict, differ)
                )
            failures.append((match[1], match[2], set()))
            sides = {}
        elif line.strip().startswith(("exp:", "got:")):
            side = line.strip()[:3]
        elif "Labels:{" in line:
            sides.setdefault(side, []).append(frozenset(LABELS.findall(line)))
    return failures[:-1]


def _promtool(folder: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [binary("promtool"), "test", "rules", Path(RULES_TEST_FILE).name],
        cwd=folder / Path(RULES_TEST_FILE).parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_rule_broken_by_hand_fails_the_generated_tests_naming_it(tmp_path: Path) -> None:
    binary("promtool")
    folders = {name: tmp_path / name for name in ("right", "broken")}
    for folder in folders.values():
        write_alerts(SLOSpec.default(), folder)
        tests_path = folder / RULES_TEST_FILE
        tests = yaml.safe_load(tests_path.read_text())
        tests["tests"] = [g for g in tests["tests"] if g["name"].startswith(GROUP_PREFIX)]
        tests_path.write_text(yaml.safe_dump(tests, sort_keys=False))
    rules = yaml.safe_load((folders["broken"] / RULES_FILE).read_text())
    for swap in BROKEN:
        _break(rules, swap)
    (folders["broken"] / RULES_FILE).write_text(yaml.safe_dump(rules, sort_keys=False))
    runs = {name: _promtool(folder) for name, folder in folders.items()}  # two at once
    reports = {name: run.communicate(timeout=300)[0] for name, run in runs.items()}
    assert runs["right"].returncode == 0, reports["right"][-3000:]
    assert runs["broken"].returncode == 1, reports["broken"][-3000:]
    failures = _failures(reports["broken"])
    named = {alertname for alertname, _, _ in failures}
    assert named == {swap.alertname for swap in BROKEN}, named
    broken = {
        swap.alertname: {(swap.tier, long, short) for long, short in swap.windows}
        for swap in BROKEN
    }
    for swap in BROKEN:
        differ = set().union(*(d for name, _, d in failures if name == swap.alertname))
        assert differ == broken[swap.alertname], (swap, differ)
