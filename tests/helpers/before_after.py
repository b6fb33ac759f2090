"""This checkout against an earlier commit, for the before/after benchmarks: both exported with
`git archive` into fresh folders (no .git: nothing of this checkout leaks in), each with its own
compiled hot path, so each runs its own code.

The earlier commit (default 3609cdd, LLM_SLO_BENCH_BEFORE to change it) is the last one before
the work of issues 22 (inside any engine), 23 (the house: one fact in one place, a readable
request path) and 24 (the GenAI conventions), which all asked that the request path get no
slower. The `trees` fixture (tests/benchmarks/conftest.py) holds both exports.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BEFORE = os.environ.get("LLM_SLO_BENCH_BEFORE", "3609cdd")
PAGE = ROOT / "docs" / "benchmarks" / "before-after.md"
TITLE = "Before and after: the request path against an earlier commit"


def export(commit: str, folder: Path) -> Path:
    """The commit's files in `folder` (no .git: nothing of this checkout leaks in)."""
    folder.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=False)
    if archive.returncode != 0:
        pytest.fail(f"git archive {commit}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def build_hot_path(tree: Path, folder: Path) -> None:
    """The tree's own compiled hot path (its `.pyx` may differ from this checkout's), built as
    `pip install` builds it, into the tree. Without it, the installed package's import hook
    would hand the tree this checkout's extension, which may not fit its Python side."""
    if not (tree / "middleware" / "_hotpath.pyx").exists():
        return  # a commit from before the compiled hot path
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(folder)]
    built = subprocess.run([*command, str(tree)], capture_output=True, text=True, check=False)
    if built.returncode != 0:
        pytest.fail(f"building {tree.name}'s hot path: {built.stderr.strip()[-2000:]}")
    (wheel,) = folder.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("middleware/_hotpath") and name.endswith(".so"):
                (tree / name).write_bytes(archive.read(name))
