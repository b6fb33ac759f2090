"""Flags of one kind look alike in every command, each kind declared once in
slo/cli/common/flags.py: a span of seconds is a float, --seed an int from 0, a certificate, key
or CA a PEM file (`add_pem_flag`), and a help that shows its default has one to show."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from slo.cli import build_parser

REPO = Path(__file__).resolve().parents[4]


def command_actions() -> list[tuple[str, argparse.Action]]:
    subparsers = next(
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    return [
        (name, action)
        for name, sub in subparsers.choices.items()
        for action in sub._actions
        if action.option_strings
    ]


def test_a_span_of_seconds_is_a_float() -> None:
    seconds = [(name, a) for name, a in command_actions() if a.metavar in ("S", "SECONDS")]
    assert len(seconds) > 10, seconds
    assert not [(name, a.dest) for name, a in seconds if a.type is not float]


def test_seed_is_an_int_from_zero_wherever_it_is_taken() -> None:
    seeds = {name: a for name, a in command_actions() if "--seed" in a.option_strings}
    assert len(seeds) >= 3, sorted(seeds)
    assert all(a.type is int and a.default == 0 for a in seeds.values()), seeds


def test_a_help_that_shows_its_default_has_one() -> None:
    shown = [(name, a) for name, a in command_actions() if "%(default)s" in (a.help or "")]
    assert len(shown) > 40
    assert not [(name, a.dest) for name, a in shown if a.default is None]


def test_no_command_spells_a_pem_flag_or_the_seed_itself() -> None:
    declared = re.compile(r'metavar="PEM"|add_argument\(\s*"--seed"')
    spelled = [
        f"{path.relative_to(REPO)}: {match.group(0)}"
        for path in sorted((REPO / "slo" / "cli").rglob("*.py"))
        if path.name != "flags.py"
        for match in declared.finditer(path.read_text(encoding="utf-8"))
    ]
    assert not spelled, f"declare these with slo/cli/common/flags.py's helpers: {spelled}"
