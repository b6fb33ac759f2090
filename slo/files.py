"""Writing generated files under an output directory."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def write_tree(out: Path, files: Mapping[str, str]) -> list[Path]:
    """Write each relative path's text under `out`, creating folders; returns the paths."""
    written = []
    for relative, text in files.items():
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
