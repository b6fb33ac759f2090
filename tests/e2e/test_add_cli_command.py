"""Adding a CLI command is its module, its entry in COMMANDS and its test: CONTRIBUTING.md's
example, made for real.

The three edits are taken from CONTRIBUTING.md ("Add a CLI command") and made in a copy of the
packages; nothing else is edited. Run as `slo` on that copy, `slo tiers --spec` prints every
tier of the example spec with its objectives, `slo --help` lists the command with its help
line, and the example's own test passes. If the page's example stops working, or needs a fourth
file, this fails.
"""

from __future__ import annotations

import re
from pathlib import Path

from slo.cli import COMMANDS
from slo.spec import SLOSpec
from tests.helpers.recipes import (
    ROOT,
    RecipeFile,
    copy_packages,
    one_line,
    recipe_files,
    run_pytest,
    run_slo,
)

SECTION = "## Add a CLI command"
REGISTRY = "slo/cli/__init__.py"
AFTER = re.compile(r'^    "lint": .*\n', re.M)  # the entry the new one follows
SPEC = "slo/examples/slo.yaml"


def command_recipe() -> tuple[RecipeFile, RecipeFile, RecipeFile]:
    files = {file.path: file for file in recipe_files(SECTION)}
    assert len(files) == 3, f"CONTRIBUTING.md's command example has {len(files)} files, not 3"
    registry = files.pop(REGISTRY)
    module, test = sorted(files.values(), key=lambda file: file.path.startswith("tests/"))
    assert module.new and test.new and not registry.new, "it adds two files and edits COMMANDS"
    assert module.path.startswith("slo/cli/") and not (ROOT / module.path).exists()
    return module, registry, test


def add_entry(registry: Path, entry: str) -> str:
    """`entry` written into COMMANDS after lint's; the command's name."""
    (name,) = re.findall(r'^"(\w+)": "[\w.]+",\n$', entry)
    assert name not in COMMANDS, f"slo {name} exists already"
    source = registry.read_text()
    anchors = AFTER.findall(source)
    assert len(anchors) == 1, f"{REGISTRY}: no one entry of lint in COMMANDS to follow: {anchors}"
    (anchor,) = anchors
    registry.write_text(source.replace(anchor, anchor + "    " + entry, 1))
    return name


def test_the_contributing_example_adds_a_command_in_three_files(tmp_path: Path) -> None:
    module, registry, test = command_recipe()
    copy = copy_packages(tmp_path / "tree", ("slo",))
    (copy / module.path).write_text(module.code)
    name = add_entry(copy / REGISTRY, registry.code)
    shown = run_slo([name, "--spec", SPEC], copy, copy, ROOT)  # the copy's example spec
    assert shown.returncode == 0, shown.stderr[-3000:]
    lines = shown.stdout.splitlines()
    tiers = sorted(SLOSpec.load(ROOT / SPEC).tiers, key=lambda tier: tier.priority)
    assert [line.split(" (")[0] for line in lines if not line.startswith("  ")] == [
        tier.name for tier in tiers
    ]
    assert [line.strip() for line in lines if line.startswith("  ")] == [
        objective.name for tier in tiers for objective in tier.objectives
    ]
    assert "premium (priority 0)" in lines and "standard (priority 1, default)" in lines
    listed = run_slo(["--help"], tmp_path, copy, ROOT)
    (help_line,) = re.findall(r'^HELP = "(.*)"$', module.code, re.M)
    assert listed.returncode == 0 and f"{name} {help_line}" in one_line(listed.stdout), (
        listed.stdout + listed.stderr
    )[-3000:]
    test_file = tmp_path / Path(test.path).name  # outside the checkout: it imports the copy
    test_file.write_text(test.code)
    ran = run_pytest(test_file, copy, ROOT)
    assert ran.returncode == 0 and "2 passed" in ran.stdout, (ran.stdout + ran.stderr)[-3000:]


def test_without_the_command_the_example_test_fails(tmp_path: Path) -> None:
    """The example's test can fail: on the packages as they are, `slo tiers` is no command."""
    *_, test = command_recipe()
    test_file = tmp_path / Path(test.path).name
    test_file.write_text(test.code)
    ran = run_pytest(test_file, ROOT)
    assert ran.returncode == 1 and "2 failed" in ran.stdout, ran.stdout[-2000:]
