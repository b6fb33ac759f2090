"""`slo lint` validates a spec and prints it normalized; `slo init` writes the example spec."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from slo.errors import UsageError


def configure_lint(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "spec", nargs="?", default="slo.yaml", help="the spec to check (default: %(default)s)"
    )


def run_lint(args: argparse.Namespace) -> int:
    import yaml

    from slo.spec import SLOSpec

    spec = SLOSpec.load(args.spec)
    sys.stdout.write(f"# {args.spec}: valid; normalized:\n")
    sys.stdout.write(yaml.safe_dump(spec.to_dict(), sort_keys=False, allow_unicode=True))
    for note in spec.notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


def configure_init(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path", nargs="?", default="slo.yaml", help="where to write it (default: %(default)s)"
    )
    parser.add_argument("--force", action="store_true", help="overwrite an existing file")


def run_init(args: argparse.Namespace) -> int:
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
