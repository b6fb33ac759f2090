"""`slo check`: judge a run, a record store or Prometheus against the spec; the exit code is
the verdict.

Exit 0: every objective met. Exit 1: an objective violated (or, with --strict, without enough
data). Exit 2: bad input, one line on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slo.cli.common.flags import add_pem_flag, add_results_flag, add_spec_flag
from slo.errors import UsageError

if TYPE_CHECKING:
    from slo.check.evaluate import EvaluationReport
    from slo.check.prometheus_source import PrometheusReader
    from slo.spec import SLOSpec

HELP = "judge records or Prometheus against the SLO spec; exit 1 on a violation"
DESCRIPTION = (
    "Evaluate every tier's objectives over a run's records (--results), a record "
    "store (--db) or Prometheus (--prometheus). Exit 0 when all are met, 1 when any is "
    "violated (or lacks data, with --strict), 2 on bad input."
)
FORMATS = ("text", "json", "junit", "markdown")


def configure(parser: argparse.ArgumentParser) -> None:
    add_spec_flag(parser)
    add_results_flag(parser)
    parser.add_argument("--db", metavar="URL", help="a record store, e.g. sqlite:///records.db")
    parser.add_argument("--prometheus", metavar="URL", help="a Prometheus server scraping llm-slo")
    add_pem_flag(
        parser,
        "--prometheus-ca-file",
        "verify an https:// --prometheus against this CA "
        "(default: $LLM_SLO_PROMETHEUS_CA_FILE, else the system's CAs)",
    )
    parser.add_argument(
        "--prometheus-token-file",
        metavar="FILE",
        help="send 'Authorization: Bearer <its first line>' to --prometheus "
        "(default: $LLM_SLO_PROMETHEUS_TOKEN_FILE)",
    )
    parser.add_argument(
        "--since",
        metavar="DURATION",
        help="only the last DURATION (e.g. 1h) instead of the spec's window",
    )
    parser.add_argument("--format", choices=FORMATS, default="text", help="default: %(default)s")
    parser.add_argument("--output", "-o", metavar="FILE", help="write the report here, not stdout")
    parser.add_argument(
        "--strict", action="store_true", help="fail (exit 1) on objectives without enough data"
    )


def run(args: argparse.Namespace) -> int:
    from slo.check.evaluate import columns_needed, evaluate
    from slo.spec import SLOSpec
    from slo.units import parse_duration

    sources = [name for name in ("results", "db", "prometheus") if getattr(args, name)]
    if len(sources) != 1:
        raise UsageError(
            "give exactly one of --results RUN.JSONL, --db URL or --prometheus URL"
            + (f" (got {', '.join('--' + s for s in sources)})" if sources else "")
        )
    spec = SLOSpec.load(args.spec) if args.spec else SLOSpec.default()
    if args.since:
        try:
            spec = dataclasses.replace(spec, window_s=parse_duration(args.since))
        except ValueError as error:
            raise UsageError(f"--since: {error}") from None
    report: EvaluationReport
    if args.results:
        if not Path(args.results).is_file():
            raise UsageError(f"--results {args.results}: no such file")
        report = _judge_jsonl(spec, args.results)
    elif args.db:
        from slo.store import RecordStore

        now = time.time()
        store = RecordStore(args.db)
        try:
            if store.engine.dialect.name == "postgresql":
                # A fleet's store: the database counts (slo/check/sql_check.py), no row leaves it.
                from slo.check.sql_check import evaluate_sql

                report = evaluate_sql(spec, store.engine, now)
            else:
                columns = store.columns(since=now - spec.window_s, columns=columns_needed(spec))
                report = evaluate(spec, columns, now=now)
        finally:
            store.close()
    else:
        from slo.check.prometheus_source import evaluate_prometheus

        reader = prometheus_reader(
            args.prometheus, ca_file=args.prometheus_ca_file, token_file=args.prometheus_token_file
        )
        try:
            report = evaluate_prometheus(spec, reader, now=time.time())
        finally:
            reader.close()
    _write(_render(report, args.format, args.strict), args.output)
    if report.any_violated or (args.strict and report.any_insufficient):
        return 1
    return 0


def _judge_jsonl(spec: SLOSpec, path: str) -> EvaluationReport:
    """DuckDB parses and counts (slo/check/jsonl_duckdb.py) where it can vouch for the input; the
    reference reader decides the rest, and names the line of any bad record."""
    from slo.check.jsonl_duckdb import evaluate_jsonl

    report = evaluate_jsonl(spec, path)
    if report is not None:
        return report
    from slo.check.evaluate import columns_needed, evaluate
    from slo.store.columns import load_jsonl_columns

    return evaluate(spec, load_jsonl_columns(path, columns_needed(spec)))


def _render(report: object, format_name: str, strict: bool) -> str:
    from slo.check.evaluate import EvaluationReport
    from slo.cli.report import formats

    assert isinstance(report, EvaluationReport)
    if format_name == "json":
        return formats.render_json(report)
    if format_name == "junit":
        return formats.render_junit(report, strict=strict)
    if format_name == "markdown":
        return formats.render_markdown(report)
    return formats.render_text(report)


def _write(text: str, output: str | None) -> None:
    if output is None:
        sys.stdout.write(text)
        return
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as error:
        raise UsageError(f"--output {output}: cannot write ({error.strerror})") from None


def prometheus_reader(
    url: str, *, ca_file: str | None = None, token_file: str | None = None
) -> PrometheusReader:
    """A reader of `url` that verifies HTTPS against `ca_file` (else the system's CAs) and sends
    `Authorization: Bearer <first line of token_file>`; each defaults to its environment
    variable ($LLM_SLO_PROMETHEUS_CA_FILE, $LLM_SLO_PROMETHEUS_TOKEN_FILE)."""
    import httpx

    from slo.check.prometheus_source import CA_FILE_ENV, TOKEN_FILE_ENV, PrometheusReader
    from slo.cli.tls import client_context, read_token_file

    ca_file = ca_file or os.environ.get(CA_FILE_ENV) or None
    token_file = token_file or os.environ.get(TOKEN_FILE_ENV) or None
    headers = {}
    if token_file is not None:
        headers["authorization"] = "Bearer " + read_token_file(f"${TOKEN_FILE_ENV}", token_file)
    verify: Any = True
    if ca_file is not None:
        verify = client_context(ca_certs=ca_file, ca_flag=f"${CA_FILE_ENV}")
    return PrometheusReader(url, httpx.Client(timeout=30.0, headers=headers, verify=verify))
