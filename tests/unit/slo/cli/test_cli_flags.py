"""The flags several commands share are declared once, in slo/cli/common/flags.py: every command
shows them with the same metavar and default, and no command module spells one again."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from slo.cli import COMMANDS, build_parser

REPO = Path(__file__).resolve().parents[4]
SHARED = {"--spec": "SLO.YAML", "--results": "RUN.JSONL", "--quiet": None}


def command_actions() -> dict[str, dict[str, argparse.Action]]:
    subparsers = next(
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    return {
        name: {flag: action for action in sub._actions for flag in action.option_strings}
        for name, sub in subparsers.choices.items()
    }


def test_a_shared_flag_looks_alike_in_every_command() -> None:
    actions = command_actions()
    assert set(actions) == set(COMMANDS)
    for flag, metavar in SHARED.items():
        taking = {name: found[flag] for name, found in actions.items() if flag in found}
        assert len(taking) >= 2, f"{flag} is taken by {sorted(taking)}: not shared"
        for name, action in taking.items():
            assert action.metavar == metavar, (name, flag, action.metavar)
            assert action.default in (None, False), (name, flag, action.default)


def test_no_command_declares_a_shared_flag_itself() -> None:
    declared = re.compile(r"add_argument\(\s*\"(" + "|".join(SHARED) + r")\"")
    spelled = [
        f"{path.relative_to(REPO)}: {match.group(1)}"
        for path in sorted((REPO / "slo" / "cli").rglob("*.py"))
        if path.name != "flags.py"
        for match in declared.finditer(path.read_text(encoding="utf-8"))
    ]
    assert not spelled, f"declare these with slo/cli/common/flags.py's helpers: {spelled}"
