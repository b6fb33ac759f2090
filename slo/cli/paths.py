"""Paths the CLI's commands are given."""

from __future__ import annotations

from pathlib import Path

from slo.errors import UsageError


def output_directory(path: str | Path) -> Path:
    """`--out`, created with its parents if need be; a clear error where it cannot be."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--out {out}: cannot create the directory ({error.strerror})") from None
    return out
