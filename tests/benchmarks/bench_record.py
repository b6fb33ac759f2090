"""Where a benchmark's numbers go: a section of a docs/benchmarks/ page, written by the run that
measured them and stamped with the commit, the date and the machine (never by hand).

A page holds one section per benchmark, between `<!-- name:start -->` and `<!-- name:end -->`;
a run rewrites its own section and keeps the others.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Changes here that are not committed change what was measured: the stamp says so.
MEASURED_PATHS = ("middleware", "slo", "tests/benchmarks", "tests/helpers")


def _git(*args: str) -> str:
    try:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def stamp(load_at_start: str) -> str:
    """Commit, date, machine and load, as the first lines of a section."""
    commit = _git("rev-parse", "--short=12", "HEAD") or "unknown"
    dirty = _git("status", "--porcelain", "--", *MEASURED_PATHS)
    changed = f" + uncommitted changes in {len(dirty.splitlines())} file(s)" if dirty else ""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"Commit `{commit}`{changed}, {now}. Machine: {os.cpu_count()} cores "
        f"({_cpu_model()}), Python {platform.python_version()}, load average (1, 5, 15 min) "
        f"{load_at_start} at the start, {load_average()} at the end; niceness {os.nice(0)}."
    )


def table(header: list[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_section(page: Path, title: str, name: str, text: str) -> None:
    """Put `text` in the section `name` of `page` (a new page starts with `title`)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{text.strip()}\n{end}"
    current = page.read_text() if page.exists() else f"# {title}\n"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.DOTALL)
    if pattern.search(current):
        updated = pattern.sub(lambda _match: block, current)
    else:
        updated = current.rstrip("\n") + "\n\n" + block + "\n"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(updated)
