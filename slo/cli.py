"""The `slo` command line: the front door that composes every package.

Each command imports what it needs inside its handler, so `import slo` stays light and never
imports torch. Bad input ends with one readable line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

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
    app = create_app(engine)
    print(f"serving {engine.name} on http://{args.host}:{args.port} (OpenAI-compatible: /v1/...)")
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


_COMMAND_BUILDERS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_serve,
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
