"""CONTRIBUTING.md points at files that exist: its paths follow the tree as rooms move."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PAGE = (ROOT / "CONTRIBUTING.md").read_text()
# Backticked repository paths (`slo/sli.py`, `engine/policies/`), placeholders (`<name>`) aside.
PATHS = sorted(
    {
        path
        for path in re.findall(
            r"`((?:slo|middleware|engine|dashboards|alerts|tests|docs)/[^`\s]*)`", PAGE
        )
        if "<" not in path and f"`{path}` (new)" not in PAGE  # what a recipe adds
    }
)


def test_the_page_names_paths() -> None:
    assert len(PATHS) > 20, PATHS


def test_every_path_it_names_exists() -> None:
    missing = [path for path in PATHS if not (ROOT / path).exists()]
    assert not missing, f"CONTRIBUTING.md names paths that are gone: {missing}"


def test_every_module_in_its_map_exists() -> None:
    (tree,) = re.findall(r"## Where things live\n\n```\n(.*?)```", PAGE, re.DOTALL)
    missing = []
    package = ""
    for line in tree.splitlines():
        top = re.match(r"^(\w+)/", line)
        if top:
            package = top.group(1)
        names = re.findall(r"(?<![\w/.*])(\w+\*?\.py|\w+/)(?=[,\s]|$)", line)
        for name in names[1:] if top else names:
            glob = name.rstrip("/")
            found = [p for p in (ROOT / package).rglob(glob) if p.is_dir() == name.endswith("/")]
            if not found:
                missing.append(f"{package}/{name}")
    assert not missing, f"the map in CONTRIBUTING.md names what the tree lacks: {missing}"
