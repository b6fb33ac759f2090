"""`slo keys`: create API keys for `slo serve --api-keys`; only their SHA-256 is stored."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from slo.errors import UsageError

if TYPE_CHECKING:
    from middleware.auth import ApiKey

HELP = "manage API keys (stored hashed)"
DESCRIPTION = "Manage the API-key file that `slo serve --api-keys` reads."

# One key as the file stores it: id and sha256 always, tier and limits when set.
KeyEntry = dict[str, str | float]


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    new = actions.add_parser("new", help="create a key, store its hash, print the key once")
    new.add_argument("--file", required=True, help="the key file (created if missing)")
    new.add_argument("--id", required=True, help="a name for the key, e.g. acme-prod")
    new.add_argument("--tier", default=None, help="the tier this key's requests belong to")
    new.add_argument("--requests-per-minute", type=float, default=None)
    new.add_argument("--tokens-per-minute", type=float, default=None)


def run(args: argparse.Namespace) -> int:
    # `new` is the only action today; argparse refuses any other.
    return _new(
        Path(args.file),
        key_id=args.id,
        tier=args.tier,
        requests_per_minute=args.requests_per_minute,
        tokens_per_minute=args.tokens_per_minute,
    )


def _new(
    path: Path,
    *,
    key_id: str,
    tier: str | None,
    requests_per_minute: float | None,
    tokens_per_minute: float | None,
) -> int:
    import yaml

    from middleware.auth import hash_key, load_keys, new_key

    for flag, value in (
        ("--requests-per-minute", requests_per_minute),
        ("--tokens-per-minute", tokens_per_minute),
    ):
        if value is not None and value <= 0:
            raise UsageError(f"{flag} must be positive, got {value}")
    entries = [] if not path.exists() else [_entry(key) for key in load_keys(path)]
    if any(entry["id"] == key_id for entry in entries):
        raise UsageError(f"{path}: a key with id '{key_id}' already exists; pick another --id")
    key = new_key()
    entry: KeyEntry = {"id": key_id, "sha256": hash_key(key)}
    optional = {
        "tier": tier,
        "requests_per_minute": requests_per_minute,
        "tokens_per_minute": tokens_per_minute,
    }
    entry.update({name: value for name, value in optional.items() if value is not None})
    entries.append(entry)
    path.write_text(yaml.safe_dump({"keys": entries}, sort_keys=False))
    print(key)
    print(
        f"stored the hash of key '{key_id}' in {path}; the key itself is shown only now",
        file=sys.stderr,
    )
    return 0


def _entry(key: ApiKey) -> KeyEntry:
    """A loaded key as the file stores it (unset fields left out)."""
    fields = {
        "id": key.id,
        "sha256": key.sha256,
        "tier": key.tier,
        "requests_per_minute": key.requests_per_minute,
        "tokens_per_minute": key.tokens_per_minute,
    }
    return {name: value for name, value in fields.items() if value is not None}
