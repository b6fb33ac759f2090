"""The flags several commands take, each declared here once: its name, metavar and default are
the same wherever it appears; a command whose use of it differs says so in its own help."""

from __future__ import annotations

import argparse

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
