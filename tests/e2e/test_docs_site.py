"""The docs site builds with `mkdocs build --strict`, and the README stays a front door.

Strict mode (with mkdocs.yml's validation settings) fails on any warning: a broken link or
anchor, a page left out of the nav, a README section the getting-started page can no longer
include. The examples on the pages are run by tests/e2e/test_readme.py.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import require_or_skip

ROOT = Path(__file__).resolve().parents[2]
BENCHMARK_PAGES = ROOT / "docs" / "benchmarks"
README_MAX_LINES = 200


def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    for module in ("mkdocs", "material"):
        if importlib.util.find_spec(module) is None:
            require_or_skip(f"{module} is not installed (pip install -e '.[dev]')")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-4000:]}"
    home = (tmp_path / "site" / "index.html").read_text()
    # The getting-started page shows the README's Quick start, included, not copied.
    assert "Install and run the demo" in home and "Run the tests:" in home


def test_the_readme_is_short_and_links_every_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES, (
        f"README.md has {len(readme.splitlines())} lines (at most {README_MAX_LINES}): "
        "move the detail to a page under docs/ and link it from the README's map"
    )
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", readme))
    pages = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "docs").rglob("*.md")
        if path.parent != BENCHMARK_PAGES
    }
    assert pages <= linked, f"pages missing from the README's map: {sorted(pages - linked)}"


def test_every_benchmark_and_every_page_it_wrote_is_on_the_benchmarks_index() -> None:
    index = (BENCHMARK_PAGES / "index.md").read_text()
    written = {page.name for page in BENCHMARK_PAGES.glob("*.md")} - {"index.md"}
    unlinked = {name for name in written if f"]({name})" not in index}
    assert not unlinked, f"docs/benchmarks/index.md does not link {sorted(unlinked)}"
    benchmarks = {path.name for path in (ROOT / "tests" / "benchmarks").glob("test_*.py")}
    unnamed = {name for name in benchmarks if f"`{name}`" not in index}
    assert not unnamed, f"docs/benchmarks/index.md does not describe {sorted(unnamed)}"
