"""The `slo` command line: `main` and the parser; each command lives in its own module.

The front door is the only part of `slo` that imports upward (engine, middleware, dashboards,
alerts), and only inside a command's `run`, so `import slo` stays light and never imports
torch. Bad input ends with one readable line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from slo.errors import UsageError

# The commands in the order `slo --help` lists them, each with the module that holds its
# HELP, DESCRIPTION, configure(parser) and run(args).
COMMANDS: dict[str, str] = {
    "serve": "slo.cli.serve",
    "proxy": "slo.cli.proxy.command",
    "keys": "slo.cli.keys",
    "check": "slo.cli.check",
    "lint": "slo.cli.lint",
    "init": "slo.cli.init",
    "generate": "slo.cli.generate",
    "bench": "slo.cli.bench.command",
    "plan": "slo.cli.plan",
    "report": "slo.cli.report.command",
    "demo": "slo.cli.demo.command",
    "compare": "slo.cli.compare.command",
}

Handler = Callable[[argparse.Namespace], int]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with `command` only that command's (building a command's parser
    imports its module: `slo check` need not load `slo bench`'s HTTP client)."""
    from slo import __version__

    parser = argparse.ArgumentParser(
        prog="slo",
        description="Latency observability and SLOs for LLM serving.",
    )
    parser.add_argument("--version", action="version", version=f"llm-slo {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name, module_name in COMMANDS.items():
        if command is not None and name != command:
            continue
        module = importlib.import_module(module_name)
        sub = subparsers.add_parser(name, help=module.HELP, description=module.DESCRIPTION)
        module.configure(sub)
        sub.set_defaults(handler=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except UsageError as error:
        print(f"slo {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
