"""Adding an engine that reports in response headers, or in its answer's body, is one module and
its test: CONTRIBUTING.md's two examples, made for real.

Each example's two files are taken from CONTRIBUTING.md ("Add an engine adapter") and written
into a copy of the packages; nothing else is edited. In a fresh interpreter on that copy the
example's own test runs: the engine's report reaches the record as queue, prefill and exact
output tokens. If an example stops working, or needs another file, this fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.recipes import ROOT, RecipeFile, copy_packages, recipe_files, run_pytest

PACKAGES = ("slo", "middleware")
SECTION = "## Add an engine adapter"
ENGINES = ("acme", "bolt")  # one that reports in headers, one in the body


def example(engine: str) -> tuple[RecipeFile, RecipeFile]:
    """The example's adapter module and its test."""
    files = recipe_files(SECTION)
    assert len(files) == 2 * len(ENGINES), f"the adapter examples have {len(files)} files"
    module, test = (file for file in files if Path(file.path).stem.endswith(engine))
    assert module.new and test.new, "each example adds its two files and edits nothing"
    assert module.path == f"middleware/upstream/engines/{engine}.py", module.path
    assert not (ROOT / module.path).exists() and test.path.startswith("tests/")
    return module, test


@pytest.mark.parametrize("engine", ENGINES)
def test_the_contributing_example_adds_an_engine_in_one_module(tmp_path: Path, engine: str) -> None:
    module, test = example(engine)
    copy = copy_packages(tmp_path / "packages", PACKAGES)
    (copy / module.path).write_text(module.code)
    test_file = tmp_path / Path(test.path).name  # outside the checkout: it imports only the copy
    test_file.write_text(test.code)
    done = run_pytest(test_file, copy)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "1 passed" in done.stdout, done.stdout[-2000:]


@pytest.mark.parametrize("engine", ENGINES)
def test_without_the_module_the_example_test_fails(tmp_path: Path, engine: str) -> None:
    """The example's test can fail: on the packages as they are (no such adapter), the engine's
    report is not read."""
    _, test = example(engine)
    test_file = tmp_path / Path(test.path).name
    test_file.write_text(test.code)
    done = run_pytest(test_file, ROOT)
    assert done.returncode == 1 and "1 failed" in done.stdout, done.stdout[-2000:]
