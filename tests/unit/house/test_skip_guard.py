"""The CI skip check (tests/helpers/skip_guard.py) on a small suite of its own, run by pytest
in a child process and registered by its conftest as tests/conftest.py does: an allowed skip
passes, an unlisted one fails the run, each is printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.skip_guard import ENV

REPO = Path(__file__).resolve().parents[3]
SUITE = """
import pytest

torch_like = pytest.importorskip("{missing_module}")
"""
TESTS = """
import pytest

def test_runs():
    pass

@pytest.mark.skipif(True, reason="needs a CUDA device")
def test_on_cuda():
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_skips_inside(n):
    pytest.skip(f"nothing to do for {n}")

@pytest.mark.xfail(reason="known", strict=True)
def test_known_failure():
    assert False
"""

CONFTEST = """
from tests.helpers import skip_guard

def pytest_configure(config):
    skip_guard.register(config)
"""


def run_suite(folder: Path, allowed: str | None) -> subprocess.CompletedProcess[str]:
    (folder / "test_suite.py").write_text(TESTS)
    (folder / "test_vanished.py").write_text(SUITE.format(missing_module="no_such_module_x"))
    (folder / "pytest.ini").write_text("[pytest]\n")
    (folder / "conftest.py").write_text(CONFTEST)  # registered as tests/conftest.py does
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(ENV, None)
    if allowed is not None:
        (folder / "allowed.txt").write_text(allowed)
        env[ENV] = str(folder / "allowed.txt")
    command = [sys.executable, "-m", "pytest", "-q", str(folder)]
    command += ["-p", "no:cacheprovider"]
    return subprocess.run(
        command, capture_output=True, text=True, cwd=folder, env=env, timeout=120, check=False
    )


EVERY_SKIP = """
# comments and blank lines are ignored

*::test_on_cuda | CUDA
*test_suite.py::test_skips_inside[[]*] | nothing to do
*test_vanished.py | no_such_module_x
"""


def test_every_skip_listed_passes_and_is_printed(tmp_path: Path) -> None:
    result = run_suite(tmp_path, EVERY_SKIP)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 skipped, 0 not allowed" in result.stdout, result.stdout
    assert "ALLOWED   test_suite.py::test_on_cuda: needs a CUDA device" in result.stdout


@pytest.mark.parametrize(
    ("dropped", "vanished"),
    [
        ("*::test_on_cuda | CUDA", "test_suite.py::test_on_cuda"),
        ("*test_vanished.py | no_such_module_x", "test_vanished.py"),  # a skip at collection
    ],
)
def test_an_unlisted_skip_fails_the_run_and_names_it(
    tmp_path: Path, dropped: str, vanished: str
) -> None:
    result = run_suite(tmp_path, EVERY_SKIP.replace(dropped, ""))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "4 skipped, 1 not allowed" in result.stdout, result.stdout
    assert f"NOT ALLOWED {vanished}: " in result.stdout, result.stdout
    assert "the run fails" in result.stdout


def test_the_reason_must_match_too(tmp_path: Path) -> None:
    result = run_suite(tmp_path, EVERY_SKIP.replace("| CUDA", "| a GPU"))
    assert result.returncode == 1, result.stdout
    assert "NOT ALLOWED test_suite.py::test_on_cuda: needs a CUDA device" in result.stdout


def test_without_the_variable_skips_are_left_alone(tmp_path: Path) -> None:
    result = run_suite(tmp_path, None)
    assert result.returncode == 0, result.stdout + result.stderr
    assert ENV not in result.stdout


def test_a_malformed_line_is_named(tmp_path: Path) -> None:
    result = run_suite(tmp_path, "tests/unit/test_x.py::test_y\n")
    assert result.returncode == 4, result.stdout + result.stderr  # pytest's usage error
    assert "allowed.txt:1: expected '<node-id pattern> | <reason text>'" in result.stderr


def test_the_ci_list_names_only_tests_that_exist() -> None:
    """Each entry of tests/ci_allowed_skips.txt matches a test: a renamed test must not leave
    a stale entry that would allow some other skip."""
    from tests.helpers.skip_guard import read_allowed

    entries = read_allowed(REPO / "tests" / "ci_allowed_skips.txt")
    assert entries
    for entry in entries:
        path, _, name = entry.pattern.partition("::")
        source = (REPO / path).read_text()
        function = re.split(r"[\[*?]", name)[0]  # the parameters' glob, `[...]` or `*`
        assert function and f"def {function}(" in source, entry
