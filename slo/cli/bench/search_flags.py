"""The flags of `slo bench` that shape open-loop arrivals and the capacity search
(`--find-max-rate`, `--find-max-concurrency`)."""

from __future__ import annotations

import argparse

from slo.capacity.arrivals import ARRIVALS
from slo.capacity.search import SearchSettings
from slo.cli.common.flags import add_number_flag, add_seconds_flag


def add_search_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--arrival",
        choices=ARRIVALS,
        default="poisson",
        help="open-loop arrivals: constant gaps, Poisson, or gamma (default: %(default)s)",
    )
    add_number_flag(
        parser,
        "--burstiness",
        float,
        1.0,
        "gamma shape with --arrival gamma: 1 is Poisson, < 1 burstier, > 1 steadier",
    )
    search = parser.add_argument_group("capacity search (--find-max-rate, --find-max-concurrency)")
    _add_bisection_flags(search)
    _add_window_flags(search)
    _add_pacing_flags(search)
    search.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help=(
            "with --embedded: a flag for `slo serve`, e.g. --serve-arg=--quantization=int8 "
            "(repeatable)"
        ),
    )


def _add_bisection_flags(search: argparse._ArgumentGroup) -> None:
    """When the search stops, and how sure it is of its answer."""
    add_number_flag(
        search,
        "--resolution",
        float,
        SearchSettings.resolution,
        "stop bisecting when the bracket is narrower than this share of its low end",
    )
    add_number_flag(search, "--max-steps", int, SearchSettings.max_steps, "at most this many steps")
    add_number_flag(
        search,
        "--confirm",
        int,
        SearchSettings.confirmations,
        "run the answer N more times, on fresh draws, before calling it the max; a failed "
        "run sends the search below it",
        metavar="N",
    )


def _add_window_flags(search: argparse._ArgumentGroup) -> None:
    """What each step measures: enough requests for the tail, time for queues to build."""
    add_number_flag(
        search,
        "--tail-events",
        int,
        10,
        "requests beyond each tier's strictest percentile per step: sizes the measured window",
    )
    add_seconds_flag(
        search,
        "--min-window",
        10.0,
        "with --find-max-rate, each step measures at least S seconds of arrivals, so queues "
        "have time to build",
    )
    add_number_flag(
        search,
        "--warmup",
        float,
        0.2,
        "warm-up requests per step, sent first and not judged, as a share of the measured ones",
        metavar="SHARE",
    )


def _add_pacing_flags(search: argparse._ArgumentGroup) -> None:
    """Where the search starts and what it waits for between steps."""
    search.add_argument(
        "--start",
        type=float,
        metavar="LOAD",
        help="first load to try (default: 0.8x a saturation probe's rate; concurrency 1)",
    )
    add_seconds_flag(
        search,
        "--cooldown",
        2.0,
        "pause after a step that did not pass, for what the server still runs of it to drain",
    )
    add_number_flag(
        search, "--probe-concurrency", int, 32, "closed-loop width of the saturation probe"
    )
