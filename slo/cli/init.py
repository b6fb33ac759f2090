"""`slo init`: write the packaged example spec (three tiers) to start from."""

from __future__ import annotations

import argparse
from pathlib import Path

from slo.errors import UsageError

HELP = "write the example SLO spec to start from"
DESCRIPTION = "Copy the packaged example spec (three tiers) to a file you can edit."


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path", nargs="?", default="slo.yaml", help="where to write it (default: %(default)s)"
    )
    parser.add_argument("--force", action="store_true", help="overwrite an existing file")


def run(args: argparse.Namespace) -> int:
    from slo.spec import example_text

    path = Path(args.path)
    if path.exists() and not args.force:
        raise UsageError(f"{path} exists; pass --force to overwrite it")
    try:
        path.write_text(example_text(), encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write {path} ({error.strerror})") from None
    print(f"wrote {path}: three tiers (premium, standard, batch); edit it, then `slo lint {path}`")
    return 0
