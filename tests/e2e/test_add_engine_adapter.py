"""Adding an engine that reports in response headers is one module and its test:
CONTRIBUTING.md's example, made for real.

The two files are taken from CONTRIBUTING.md ("Add an engine adapter") and written into a copy
of the packages; nothing else is edited. In a fresh interpreter on that copy the example's own
test runs: the engine's headers reach the record as queue, prefill and exact output tokens. If
the page's example stops working, or needs another file, this fails.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("slo", "middleware")
SECTION = "## Add an engine adapter"


def example_files() -> dict[str, str]:
    """The example's files: each python block, under the path the item before it names."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"^\d\. `([^`]+\.py)`.*?```python\n(.*?)```", section, re.DOTALL | re.M)
    assert len(found) == 2, f"CONTRIBUTING.md's adapter example has {len(found)} files, not 2"
    return {path: textwrap.dedent(code) for path, code in found}


def run_pytest(test_file: Path, pythonpath: Path) -> subprocess.CompletedProcess[str]:
    """The example's test, run by pytest in a fresh interpreter that imports from `pythonpath`."""
    folder = test_file.parent
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "--rootdir",
            str(folder),
            str(test_file),
        ],
        cwd=folder,
        env={**os.environ, "PYTHONPATH": str(pythonpath)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_contributing_example_adds_a_header_engine_in_one_module(tmp_path: Path) -> None:
    copy = tmp_path / "tree"
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    files = example_files()
    module, test = sorted(files, key=lambda path: path.startswith("tests/"))
    assert module.startswith("middleware/upstream/engines/") and not (ROOT / module).exists()
    (copy / module).write_text(files[module])
    test_file = tmp_path / Path(test).name  # outside the checkout: it imports only the copy
    test_file.write_text(files[test])
    done = run_pytest(test_file, pythonpath=copy)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "1 passed" in done.stdout, done.stdout[-2000:]


def test_without_the_module_the_example_test_fails(tmp_path: Path) -> None:
    """The example's test can fail: on the packages as they are (no Acme adapter), the
    headers are not read."""
    test = next(code for path, code in example_files().items() if path.startswith("tests/"))
    test_file = tmp_path / "test_engine_acme.py"
    test_file.write_text(test)
    done = run_pytest(test_file, pythonpath=ROOT)
    assert done.returncode == 1 and "1 failed" in done.stdout, done.stdout[-2000:]
