"""The flags of `slo bench` that shape open-loop arrivals and the capacity search
(`--find-max-rate`, `--find-max-concurrency`)."""

from __future__ import annotations

import argparse

from slo.capacity.arrivals import ARRIVALS
from slo.capacity.search import SearchSettings


def add_search_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--arrival",
        choices=ARRIVALS,
        default="poisson",
        help="open-loop arrivals: constant gaps, Poisson, or gamma (default: %(default)s)",
    )
    parser.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help=(
            "gamma shape with --arrival gamma: 1 is Poisson, < 1 burstier, > 1 steadier (default: "
            "%(default)s)"
        ),
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
    search.add_argument(
        "--resolution",
        type=float,
        default=SearchSettings.resolution,
        help=(
            "stop bisecting when the bracket is narrower than this share of its low end (default: "
            "%(default)s)"
        ),
    )
    search.add_argument(
        "--max-steps",
        type=int,
        default=SearchSettings.max_steps,
        help="at most this many steps (default: %(default)s)",
    )
    search.add_argument(
        "--confirm",
        type=int,
        default=SearchSettings.confirmations,
        metavar="N",
        help=(
            "run the answer N more times, on fresh draws, before calling it the max; a failed "
            "run sends the search below it (default: %(default)s)"
        ),
    )


def _add_window_flags(search: argparse._ArgumentGroup) -> None:
    """What each step measures: enough requests for the tail, time for queues to build."""
    search.add_argument(
        "--tail-events",
        type=int,
        default=10,
        help=(
            "requests beyond each tier's strictest percentile per step: sizes the measured window "
            "(default: %(default)s)"
        ),
    )
    search.add_argument(
        "--min-window",
        type=float,
        default=10.0,
        metavar="S",
        help=(
            "with --find-max-rate, each step measures at least S seconds of arrivals, so queues "
            "have time to build (default: %(default)s)"
        ),
    )
    search.add_argument(
        "--warmup",
        type=float,
        default=0.2,
        metavar="SHARE",
        help=(
            "warm-up requests per step, sent first and not judged, as a share of the measured "
            "ones (default: %(default)s)"
        ),
    )


def _add_pacing_flags(search: argparse._ArgumentGroup) -> None:
    """Where the search starts and what it waits for between steps."""
    search.add_argument(
        "--start",
        type=float,
        metavar="LOAD",
        help="first load to try (default: 0.8x a saturation probe's rate; concurrency 1)",
    )
    search.add_argument(
        "--cooldown",
        type=float,
        default=2.0,
        metavar="S",
        help=(
            "pause after a step that did not pass, for what the server still runs of it to drain "
            "(default: %(default)s)"
        ),
    )
    search.add_argument(
        "--probe-concurrency",
        type=int,
        default=32,
        help="closed-loop width of the saturation probe (default: %(default)s)",
    )
