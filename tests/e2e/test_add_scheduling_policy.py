"""Adding a scheduling policy is one module and its test: CONTRIBUTING.md's example, made for
real.

The two files are taken from CONTRIBUTING.md ("Add a scheduling policy") and written into a copy
of the packages; nothing else is edited. In fresh interpreters on that copy `engine.policies`
finds the policy without importing torch, `EngineConfig(scheduling=...)` schedules with it,
`slo serve --help` offers it under --scheduling with its help line, and the example's own test
passes. If the page's example stops working, or needs another file, this fails.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.recipes import (
    ROOT,
    RecipeFile,
    copy_packages,
    one_line,
    python_env,
    recipe_files,
    run_pytest,
    run_slo,
)

pytest.importorskip("torch")  # the example's test and the scheduler need it; the policy not

SECTION = "## Add a scheduling policy"

SCRIPT = """
import json, sys
import engine.policies
from engine.policies import POLICIES, POLICY_NAMES
light = "torch" not in sys.modules
from engine.config import EngineConfig
from engine.kv_cache import BlockAllocator
from engine.scheduler import Scheduler

assert engine.policies.__file__.startswith(sys.argv[1]), engine.policies.__file__
name = sys.argv[2]
config = EngineConfig(scheduling=name)
policy = Scheduler.from_config(config, BlockAllocator(8)).policy
print(json.dumps({"names": POLICY_NAMES, "help": POLICIES[name].help, "light": light,
                  "scheduling": config.scheduling, "runs": type(policy).__module__}))
"""


def policy_recipe() -> tuple[RecipeFile, RecipeFile]:
    files = recipe_files(SECTION)
    assert len(files) == 2, f"CONTRIBUTING.md's policy example has {len(files)} files, not 2"
    module, test = sorted(files, key=lambda file: file.path.startswith("tests/"))
    assert module.new and test.new, "the policy example only adds files"
    assert module.path.startswith("engine/policies/") and not (ROOT / module.path).exists()
    return module, test


def policy_name(module: RecipeFile) -> str:
    (name,) = re.findall(r'^    name: ClassVar\[str\] = "(\w+)"$', module.code, re.M)
    return name


def test_the_contributing_example_adds_a_policy_in_one_module(tmp_path: Path) -> None:
    module, test = policy_recipe()
    name = policy_name(module)
    copy = copy_packages(tmp_path / "tree", ("slo", "engine"))
    (copy / module.path).write_text(module.code)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(copy), name],
        cwd=tmp_path,
        env=python_env(copy),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert name in got["names"] and got["light"], got  # found, and without torch
    assert (got["scheduling"], got["runs"]) == (name, f"engine.policies.{name}"), got
    served = run_slo(["serve", "--help"], tmp_path, copy)
    assert served.returncode == 0, served.stderr[-3000:]
    assert f"--scheduling {{{','.join(got['names'])}}}" in served.stdout, served.stdout
    assert f"{name}: {got['help']}" in one_line(served.stdout), served.stdout
    test_file = tmp_path / Path(test.path).name  # outside the checkout: it imports the copy
    test_file.write_text(test.code)
    ran = run_pytest(test_file, copy, ROOT)  # the checkout after the copy: tests.helpers
    assert ran.returncode == 0 and "1 passed" in ran.stdout, (ran.stdout + ran.stderr)[-3000:]


def test_without_the_module_the_example_test_fails(tmp_path: Path) -> None:
    """The example's test can fail: on the packages as they are, no such policy exists."""
    _, test = policy_recipe()
    test_file = tmp_path / Path(test.path).name
    test_file.write_text(test.code)
    ran = run_pytest(test_file, ROOT)
    assert ran.returncode == 1 and "1 failed" in ran.stdout, ran.stdout[-2000:]
    assert "is unknown" in ran.stdout, ran.stdout[-2000:]
