"""`slo lint`: validate a spec (ours or OpenSLO v1) and print it normalized."""

from __future__ import annotations

import argparse
import sys

HELP = "validate an SLO spec and print it normalized"
DESCRIPTION = "Validate an SLO spec (ours or OpenSLO v1) and print it normalized."


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "spec", nargs="?", default="slo.yaml", help="the spec to check (default: %(default)s)"
    )


def run(args: argparse.Namespace) -> int:
    import yaml

    from slo.spec import SLOSpec

    spec = SLOSpec.load(args.spec)
    sys.stdout.write(f"# {args.spec}: valid; normalized:\n")
    sys.stdout.write(yaml.safe_dump(spec.to_dict(), sort_keys=False, allow_unicode=True))
    for note in spec.notes:
        print(f"note: {note}", file=sys.stderr)
    return 0
