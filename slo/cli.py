"""The `slo` command line: the front door that composes every package.

Each command imports what it needs inside its handler, so `import slo` stays light and never
imports torch. Bad input ends with one readable line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from slo.errors import UsageError

Handler = Callable[[argparse.Namespace], int]


def _add_serve(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible API",
        description="Start the bundled engine (or a Hugging Face-format checkpoint) behind an "
        "OpenAI-compatible HTTP API with uvicorn.",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: %(default)s)"
    )
    parser.add_argument(
        "--port", type=int, default=8000, help="port to bind (default: %(default)s)"
    )
    parser.add_argument(
        "--model",
        default="bundled:tiny",
        help="'bundled:tiny' or a directory with config.json, *.safetensors and tokenizer.json",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (default: %(default)s)")
    parser.add_argument(
        "--dtype", default="auto", help="auto, float32 or bfloat16 (default: %(default)s)"
    )
    parser.add_argument(
        "--max-waiting",
        type=int,
        default=256,
        help="requests allowed to wait for a batch slot before new ones get 429 (default: %(default)s)",
    )
    parser.add_argument(
        "--spec", default=None, help="SLO spec YAML (default: the packaged example spec)"
    )
    parser.add_argument(
        "--store",
        default="sqlite:///slo-records.db",
        help="where request records go: sqlite:///FILE or postgresql://... (default: %(default)s)",
    )
    parser.add_argument(
        "--alertmanager-url",
        default=None,
        help="push alerts the live SLO evaluator fires to this Alertmanager (e.g. http://127.0.0.1:9093)",
    )
    parser.add_argument(
        "--no-middleware",
        action="store_true",
        help="serve the bare engine API, without latency middleware, /metrics or /slo",
    )
    parser.add_argument(
        "--step-delay-ms",
        type=float,
        default=0.0,
        help="slow every engine step down by this much, to drill latency alerts (default: 0)",
    )
    parser.add_argument(
        "--log-level", default="warning", help="uvicorn log level (default: %(default)s)"
    )
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from engine import CheckpointError, Engine, EngineConfig
    from engine.api import create_app

    if args.step_delay_ms < 0:
        raise UsageError(f"--step-delay-ms must be >= 0, got {args.step_delay_ms}")
    config = EngineConfig(
        device=args.device,
        dtype=args.dtype,
        max_waiting=args.max_waiting,
        step_delay_s=args.step_delay_ms / 1000,
    )
    try:
        engine = Engine.from_pretrained(args.model, config)
    except CheckpointError as error:
        raise UsageError(f"--model {args.model}: {error}") from error
    engine.start_sync()  # load and warm up before accepting traffic; the cold start is reported
    app: Any = create_app(engine)
    middleware = None
    if not args.no_middleware:
        from middleware import LatencyMiddleware

        middleware = LatencyMiddleware(
            app,
            spec=args.spec,
            store=args.store,
            model=engine.name,
            gpu_stats=engine.gpu_stats,
            alertmanager_url=args.alertmanager_url,
        )
        engine.add_hooks(middleware.engine_hooks())
        if engine.cold_start is not None:
            middleware.observe_cold_start(engine.cold_start.total_s)
        app = middleware
    print(f"serving {engine.name} on http://{args.host}:{args.port} (OpenAI-compatible: /v1/...)")
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        if middleware is not None:
            middleware.close()
    return 0


def _add_check(subparsers: argparse._SubParsersAction) -> None:
    from slo.check import configure

    parser = subparsers.add_parser(
        "check",
        help="judge records or Prometheus against the SLO spec; exit 1 on a violation",
        description="Evaluate every tier's objectives over a run's records (--results), a record "
        "store (--db) or Prometheus (--prometheus). Exit 0 when all are met, 1 when any is "
        "violated (or lacks data, with --strict), 2 on bad input.",
    )
    configure(parser)
    parser.set_defaults(handler=_check)


def _check(args: argparse.Namespace) -> int:
    from slo.check import run

    return run(args)


def _add_lint(subparsers: argparse._SubParsersAction) -> None:
    from slo.lint import configure_lint

    parser = subparsers.add_parser(
        "lint",
        help="validate an SLO spec and print it normalized",
        description="Validate an SLO spec (ours or OpenSLO v1) and print it normalized.",
    )
    configure_lint(parser)
    parser.set_defaults(handler=_lint)


def _lint(args: argparse.Namespace) -> int:
    from slo.lint import run_lint

    return run_lint(args)


def _add_init(subparsers: argparse._SubParsersAction) -> None:
    from slo.lint import configure_init

    parser = subparsers.add_parser(
        "init",
        help="write the example SLO spec to start from",
        description="Copy the packaged example spec (three tiers) to a file you can edit.",
    )
    configure_init(parser)
    parser.set_defaults(handler=_init)


def _init(args: argparse.Namespace) -> int:
    from slo.lint import run_init

    return run_init(args)


_COMMAND_BUILDERS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_serve,
    _add_check,
    _add_lint,
    _add_init,
]


def build_parser() -> argparse.ArgumentParser:
    from slo import __version__

    parser = argparse.ArgumentParser(
        prog="slo",
        description="Latency observability and SLOs for LLM serving.",
    )
    parser.add_argument("--version", action="version", version=f"llm-slo {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for add_command in _COMMAND_BUILDERS:
        add_command(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except UsageError as error:
        print(f"slo {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
