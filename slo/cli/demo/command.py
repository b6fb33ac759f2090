"""`slo demo`: the whole product in one command, on a laptop, in under a minute.

Serve the bundled engine behind the latency middleware (a `slo serve` child process on a free
loopback port), send it a short mixed-tier benchmark, print where the time went and the SLO
verdicts, and leave everything behind in one directory: the records, the server's own view
(/metrics, /slo), report.html, and what `slo generate` writes for the same spec.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slo.cli.common.flags import (
    add_number_flag,
    add_quiet_flag,
    add_seconds_flag,
    add_seed_flag,
    add_spec_flag,
)
from slo.cli.paths import output_directory
from slo.errors import UsageError

if TYPE_CHECKING:
    from slo.cli.bench.runner import RunResult
    from slo.spec import SLOSpec

# Mixed tiers at a rate the bundled model on two CPU cores serves with room to spare: the
# premium lane should look premium. Raise --rate to watch the tiers pull apart.
DEMO_TIER_MIX = "premium=0.2,standard=0.6,batch=0.2"

HELP = "the one-command tour: serve, benchmark, judge, report, generate (under a minute)"
DESCRIPTION = (
    "Start the bundled engine behind the latency middleware on 127.0.0.1, run a "
    "short mixed-tier benchmark, print the per-tier breakdown and SLO verdicts, and write "
    "the records, report.html and everything `slo generate` writes into --out."
)


def configure(parser: argparse.ArgumentParser) -> None:
    _add_tour_flags(parser)
    _add_scenario_flags(parser)


def _add_tour_flags(parser: argparse.ArgumentParser) -> None:
    """Where the tour writes, what judges it, and the benchmark it runs."""
    parser.add_argument(
        "--out", default="slo-demo", help="directory to write into (default: %(default)s)"
    )
    add_spec_flag(parser, help="SLO spec (default: the packaged example, copied to OUT/slo.yaml)")
    add_number_flag(parser, "--requests", int, 60, "requests in the benchmark")
    add_number_flag(parser, "--rate", float, 5.0, "Poisson arrivals, requests/s")
    add_seed_flag(parser, "benchmark seed")
    add_seconds_flag(parser, "--duration-limit", 60.0, "stop the benchmark after S seconds")
    add_quiet_flag(parser)


def _add_scenario_flags(parser: argparse.ArgumentParser) -> None:
    """Which scenario runs, and the phases of the overload and regression ones."""
    parser.add_argument(
        "--scenario",
        choices=("tour", "overload", "regression"),
        default="tour",
        help="tour: the whole product on light traffic; overload: a batch "
        "flood under fifo, then under slo scheduling, side by side; "
        "regression: prefill 2x slower, and what the alerts say about it "
        "(default: %(default)s)",
    )
    add_seconds_flag(
        parser,
        "--calm",
        4.0,
        "overload: seconds of premium traffic alone; regression: seconds of calibration and of "
        "healthy traffic",
    )
    add_seconds_flag(parser, "--slow", 15.0, "regression: seconds with prefill 2x slower")
    add_seconds_flag(parser, "--flood", 15.0, "overload: seconds of the batch flood")
    add_number_flag(parser, "--flood-clients", int, 24, "overload: batch clients")


def run(args: argparse.Namespace) -> int:
    if args.scenario == "overload":
        from slo.cli.demo.overload import run_overload

        return run_overload(args)
    if args.scenario == "regression":
        from slo.cli.demo.regression import run_regression

        return run_regression(args)
    return _tour(args)


# What the tour leaves in --out, each file with the line that says what it is.
Written = list[tuple[Path, str]]


def _tour(args: argparse.Namespace) -> int:
    from slo.spec import SLOSpec

    began = time.perf_counter()
    out = output_directory(args.out)
    spec_path = _write_spec(args.spec, out / "slo.yaml")
    spec = SLOSpec.load(spec_path)
    written: Written = [(spec_path, "the SLO spec everything here was judged by")]
    results = out / "results.jsonl"
    result = _benchmark(args, spec_path, out, results, written)
    _judge(spec, result.records, result.elapsed_s)
    _draw_report(spec, result.records, out, written)
    _generate(spec_path, out, written)
    print(f"\nslo demo: done in {time.perf_counter() - began:.0f} s. Files:")
    for path, description in written:
        shown = f"{path}/" if path.is_dir() else str(path)
        print(f"  {shown:<40} {description}")
    print(f"\nnext: open {out / 'report.html'}")
    print(f"      slo check --spec {spec_path} --results {results}")
    return 0


def _write_spec(given: str | None, spec_path: Path) -> Path:
    """OUT/slo.yaml: the given spec copied, or the packaged example."""
    if given:
        if Path(given).resolve() != spec_path.resolve():
            shutil.copyfile(_existing(given), spec_path)
    else:
        spec_path.write_text(
            resources.files("slo").joinpath("examples/slo.yaml").read_text("utf-8"), "utf-8"
        )
    return spec_path


def _benchmark(
    args: argparse.Namespace, spec_path: Path, out: Path, results: Path, written: Written
) -> RunResult:
    """Serve the bundled engine, send it the benchmark, keep the server's own view of it."""
    import httpx

    from slo.cli.bench.command import describe_stop, execute
    from slo.cli.bench.options import BenchOptions
    from slo.cli.bench.server import embedded_server

    store = out / "server-records.db"
    for stale in (
        store,
        store.with_name(store.name + "-wal"),
        store.with_name(store.name + "-shm"),
    ):
        stale.unlink(missing_ok=True)  # this run's server records only

    _step("starting the bundled engine behind the latency middleware on 127.0.0.1")
    with embedded_server(spec=str(spec_path), store=f"sqlite:///{store}") as base_url:
        _step(f"serving at {base_url}")
        _step(
            f"benchmarking: {args.requests} chat requests, {args.rate:g} req/s, "
            f"tiers {DEMO_TIER_MIX}"
        )
        options = BenchOptions(
            profile="chat",
            requests=args.requests,
            rate=args.rate,
            tier_mix=DEMO_TIER_MIX,
            seed=args.seed,
            duration_limit_s=args.duration_limit,
            progress=not args.quiet,
        )
        result = execute(options, base_url, results)
        for path, description in ((out / "metrics.prom", "/metrics"), (out / "slo.json", "/slo")):
            path.write_bytes(httpx.get(base_url + description, timeout=10).content)
            written.append((path, f"the server's {description} at the end of the run"))
    written.insert(1, (results, f"{len(result.records)} request records, client + server view"))
    written.append((store, "the server's own records (`slo check --db sqlite:///...`)"))
    print(describe_stop(result))
    if not result.records:
        raise UsageError("the benchmark finished no request; see the messages above")
    return result


def _judge(spec: SLOSpec, records: list[dict[str, Any]], elapsed_s: float) -> None:
    from slo.check.evaluate import evaluate
    from slo.check.summary import columns_of
    from slo.cli.bench.summary import render_summary
    from slo.cli.report.formats import render_text

    columns = columns_of(records)
    print()
    sys.stdout.write(render_summary(spec, columns, elapsed_s))
    print()
    sys.stdout.write(render_text(evaluate(spec, columns)))


def _draw_report(spec: SLOSpec, records: list[dict[str, Any]], out: Path, written: Written) -> None:
    _step("drawing the report")
    try:
        from slo.cli.report.command import write_report

        report = write_report(spec, records, out / "report.html", "slo demo")
        written.append((report, "charts and verdicts in one offline HTML page"))
    except UsageError as error:  # matplotlib missing: the rest of the tour still stands
        print(f"  skipped report.html: {error}")


def _generate(spec_path: Path, out: Path, written: Written) -> None:
    from slo.cli.generate import Targets, generate

    _step("generating dashboards, alert rules and runbooks for the same spec (slo generate)")
    generate(str(spec_path), out, Targets())
    for folder, description in (
        ("grafana", "Grafana dashboards + provisioning"),
        ("prometheus", "recording and alerting rules + promtool tests"),
        ("alertmanager", "Alertmanager routing per tier and severity"),
        ("runbooks", "one runbook per alert"),
    ):
        if (out / folder).exists():
            written.append((out / folder, description))


def _existing(path: str) -> Path:
    if not Path(path).is_file():
        raise UsageError(f"--spec {path}: no such file")
    return Path(path)


def _step(message: str) -> None:
    print(f"slo demo: {message} ...", flush=True)
