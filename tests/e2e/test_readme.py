"""The README's and the docs site's commands and examples work as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
# Every page of the docs site, subfolders included, runs its examples too: each page is one
# section named after its path (`docs/slo-check.md`). A page written by a benchmark
# (docs/benchmarks/) states its commands as inline code or `text`, so nothing here runs one.
DOCS = sorted((ROOT / "docs").rglob("*.md"))
# Languages of blocks that are shown and not run; every other block must be bash or python.
SHOWN_ONLY = ("yaml", "text")
OPENING = re.compile(r"^\s*```")


def sections() -> dict[str, str]:
    parts = re.split(r"^## ", README, flags=re.MULTILINE)
    found = {part.splitlines()[0].strip(): part for part in parts[1:]}
    for page in DOCS:
        found[f"docs/{page.relative_to(ROOT / 'docs').as_posix()}"] = page.read_text()
    return found


def blocks(
    language: str, skip_sections: tuple[str, ...] = ("Quick start",)
) -> list[tuple[str, str]]:
    found = []
    for title, text in sections().items():
        if title in skip_sections:
            continue
        for index, match in enumerate(FENCE.finditer(text)):
            if match.group(1) == language:
                found.append((f"{title} #{index + 1}", match.group(2)))
    return found


def test_quick_start_has_exactly_two_set_up_commands_and_ci_runs_the_test_one() -> None:
    quick = sections()["Quick start"]
    commands = [m.group(2).strip() for m in FENCE.finditer(quick) if m.group(1) == "bash"]
    assert len(commands) == 2, commands
    demo, tests = commands
    assert "pip install" in demo and demo.endswith("slo demo")
    assert "pytest" in tests
    assert tests in (ROOT / ".ci" / "run").read_text(), (
        "`.ci/run` must run the README's test command word for word"
    )


def test_every_code_block_is_run_or_shown_on_purpose() -> None:
    """A block the runner cannot see (indented, `sh`, a title after the language) would be
    untested without a word: every fence must open a bash, python, yaml or text block."""
    unseen = []
    for title, text in sections().items():
        fences = [line for line in text.splitlines() if OPENING.match(line)]
        opening = fences[::2]  # fences alternate: opening, closing
        seen = [match.group(1) for match in FENCE.finditer(text)]
        if len(opening) != len(seen) or not set(seen) <= {"bash", "python", *SHOWN_ONLY}:
            unseen.append((title, opening, seen))
    assert not unseen, f"blocks the runner would skip or not recognise: {unseen}"


@pytest.mark.parametrize(("where", "script"), blocks("bash"), ids=[w for w, _ in blocks("bash")])
def test_bash_examples_run(where: str, script: str, tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=ROOT,
        env={
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        },
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, (
        f"{where} failed:\n{script}\n"
        f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}"
    )


@pytest.mark.parametrize(("where", "code"), blocks("python"), ids=[w for w, _ in blocks("python")])
def test_python_examples_run(where: str, code: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, f"{where} failed:\n{code}\n{result.stderr[-3000:]}"
