"""CONTRIBUTING.md's recipes, made for real: the files a recipe writes, a copy of the packages to
write them into, and pytest or `slo` run in a fresh interpreter that imports that copy first.

A recipe's files are its numbered items: "1. `path/to/file.py` (new), what it is", then the
file's python block. A path marked "(new)" is a file the recipe adds; one without it, a file
the recipe edits with the block.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_ITEM = re.compile(r"^\d\. `([^`]+\.py)`( \(new\))?.*?```python\n(.*?)```", re.DOTALL | re.M)


@dataclass(frozen=True, slots=True)
class RecipeFile:
    path: str  # from the repository's root
    code: str
    new: bool  # the recipe adds the file; else it edits it with `code`


def recipe_files(section: str) -> list[RecipeFile]:
    """The files of CONTRIBUTING.md's recipe under the heading `section`, in its order."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert section in text, f"CONTRIBUTING.md has no section {section!r}"
    body = text.split(section, 1)[1].split("\n## ", 1)[0]
    return [
        RecipeFile(path, textwrap.dedent(code), bool(new))
        for path, new, code in _ITEM.findall(body)
    ]


def copy_packages(destination: Path, packages: tuple[str, ...]) -> Path:
    """A copy of the repository's `packages` under `destination`, to apply a recipe to."""
    for package in packages:
        shutil.copytree(
            ROOT / package, destination / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    return destination


def python_env(*pythonpath: Path) -> dict[str, str]:
    """This environment with `pythonpath` first on the path of a child interpreter."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(str(path) for path in pythonpath)}


def run_pytest(test_file: Path, *pythonpath: Path) -> subprocess.CompletedProcess[str]:
    """`test_file` run by pytest in a fresh interpreter importing from `pythonpath` first."""
    folder = test_file.parent
    options = ["-q", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", str(folder)]
    return subprocess.run(
        [sys.executable, "-m", "pytest", *options, str(test_file)],
        cwd=folder,
        env=python_env(*pythonpath),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def run_slo(args: list[str], cwd: Path, *pythonpath: Path) -> subprocess.CompletedProcess[str]:
    """`slo ARGS` (the console script beside this interpreter, else `python -m slo.cli`) in a
    fresh interpreter importing from `pythonpath` first; wide, so help lines are not wrapped."""
    script = shutil.which("slo", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "slo.cli"]
    return subprocess.run(
        [*command, *args],
        cwd=cwd,
        env={**python_env(*pythonpath), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def one_line(text: str) -> str:
    """`text` with every run of whitespace one space: argparse's help, unwrapped."""
    return " ".join(text.split())
