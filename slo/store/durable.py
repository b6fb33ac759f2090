"""Where a store's spool lives, and how durable a record is once `add()` returns.

By default a record is in the page cache when `add()` returns (`slo.store.spool`): a killed
process loses none, a machine crash may lose what the kernel had not written back yet.
`spool_fsync` (`RecordStore(spool_fsync=True)`, or `LLM_SLO_SPOOL_FSYNC=1` in the environment
of `slo serve`, `slo proxy` or an app mounting the middleware) makes that window zero: each
append waits for the disk (`O_DSYNC`), and SQLite commits with `synchronous=FULL`, so a
record leaves the spool only once the database has it on disk too (PostgreSQL's default,
`synchronous_commit=on`, already does).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from sqlalchemy import make_url

from slo.errors import UsageError

FSYNC_VARIABLE = "LLM_SLO_SPOOL_FSYNC"
_YES, _NO = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def default_spool_dir(url: str) -> Path:
    """Next to a SQLite file (same disk, same permissions); the temp dir otherwise."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        return Path(parsed.database).resolve().parent
    return Path(tempfile.gettempdir())


def spool_key(url: str) -> str:
    """A short name for the database, so that a spool is only ever replayed into its own."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        parsed = parsed.set(database=str(Path(parsed.database).resolve()), query={})
    identity = parsed.render_as_string(hide_password=True)
    return hashlib.sha256(identity.encode()).hexdigest()[:12]


def fsync_wanted(given: bool | None) -> bool:
    """`given`, or else what LLM_SLO_SPOOL_FSYNC says (off when unset)."""
    if given is not None:
        return given
    value = os.environ.get(FSYNC_VARIABLE, "")
    if value.strip().lower() in _YES:
        return True
    if value.strip().lower() in _NO:
        return False
    raise UsageError(
        f"{FSYNC_VARIABLE}={value!r} in the environment: use 1 (each record on the disk before "
        "add() returns) or 0 (in the page cache: a killed process loses none; the default)"
    )


def sqlite_pragmas(fsync: bool) -> Any:
    """The listener that sets each new SQLite connection up: WAL, and how it syncs."""
    synchronous = "FULL" if fsync else "NORMAL"

    def set_up(dbapi_connection: Any, _record: Any) -> None:
        # WAL lets `slo check --db` read while the server writes. NORMAL is safe under WAL
        # (no corruption), but a machine crash may take the last commits, which FULL keeps.
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.close()

    return set_up
