"""The flags several commands take, each declared here once: its name, metavar and default are
the same wherever it appears; a command whose use of it differs says so in its own help."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from slo.errors import UsageError

SPEC_HELP = "the SLO spec (default: the packaged example spec)"


def add_spec_flag(parser: argparse._ActionsContainer, help: str = SPEC_HELP) -> None:
    """`--spec SLO.YAML`: the spec the command judges, serves or generates by."""
    parser.add_argument("--spec", metavar="SLO.YAML", help=help)


def add_results_flag(parser: argparse._ActionsContainer) -> None:
    """`--results RUN.JSONL`: the records `slo bench` wrote."""
    parser.add_argument(
        "--results", metavar="RUN.JSONL", help="records of a run (slo bench output)"
    )


def add_quiet_flag(parser: argparse._ActionsContainer) -> None:
    """`--quiet`: a benchmark without its progress bar."""
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


# How a flag's help ends when it shows its default (argparse fills the value in).
SHOWN_DEFAULT = " (default: %(default)s)"


def add_number_flag(
    parser: argparse._ActionsContainer,
    flag: str,
    kind: type[int] | type[float],
    default: float,
    help: str,
    metavar: str | None = None,
) -> None:
    """A number (`kind`: int or float) with a default, which its help ends with."""
    parser.add_argument(
        flag, type=kind, default=default, metavar=metavar, help=help + SHOWN_DEFAULT
    )


def add_seconds_flag(
    parser: argparse._ActionsContainer, flag: str, default: float, help: str, metavar: str = "S"
) -> None:
    """A span of time: a float of seconds, shown as S (or SECONDS), its default after its help."""
    add_number_flag(parser, flag, float, default, help, metavar)


def add_seed_flag(parser: argparse._ActionsContainer, help: str) -> None:
    """`--seed`: where the command's random draws start, 0 unless given."""
    add_number_flag(parser, "--seed", int, 0, help)


def add_pem_flag(parser: argparse._ActionsContainer, flag: str, help: str) -> None:
    """A certificate, its key or a CA bundle: a PEM file, none unless given."""
    parser.add_argument(flag, metavar="PEM", help=help)


def add_address_flag(parser: argparse._ActionsContainer, flag: str, help: str) -> None:
    """A listening address, HOST:PORT, none unless given."""
    parser.add_argument(flag, metavar="HOST:PORT", default=None, help=help)


def check_at_least_one(flags: Mapping[str, int | None]) -> None:
    """Each count flag, when given, is at least 1: one line naming the first that is not."""
    for flag, value in flags.items():
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
