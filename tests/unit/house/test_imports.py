"""Every module of every package imports; the core stays light; only `slo.cli` imports upward."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("engine", "middleware", "slo", "dashboards", "alerts", "tools")
# The packages the core sits under: only the front door may import them.
UPWARD = ("engine", "middleware", "dashboards", "alerts")
FRONT_DOOR = "slo.cli"


def modules(package: str) -> list[str]:
    """The package and every module below it, found by walking the source tree."""
    root = importlib.import_module(package)
    found = [package]
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        if not info.name.endswith(".__main__"):  # running it is its whole job
            found.append(info.name)
    return found


def imported_names(module: str, *, type_checking: bool = True) -> set[str]:
    """Every module named by an import statement of `module`, function-level ones included
    (and those under `if TYPE_CHECKING:` unless `type_checking` is False)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    if not spec.origin.endswith(".py"):
        # A compiled extension (the per-event hot path): its source is Cython, and its
        # pure-Python twin, a module of its own, is checked with the rest.
        return set()
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    skipped: set[int] = set()
    if not type_checking:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped.update(id(inner) for child in node.body for inner in ast.walk(child))
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


ALL_MODULES = [name for package in PACKAGES for name in modules(package)]


def test_the_walk_finds_the_modules_it_must() -> None:
    # A walk that silently found nothing would pass every check below.
    for expected in (
        "slo.sli",
        "slo.cli.check",
        "slo.cli.bench.client",
        "engine.api.app",
        "middleware.core",
        "dashboards",
        "alerts.rules",
        "tools.train_bundled",
    ):
        assert expected in ALL_MODULES


@pytest.mark.parametrize("package", ["middleware", "slo"])
def test_the_light_packages_never_import_torch(package: str) -> None:
    # A fresh process imports every module of the package: torch in sys.modules afterwards
    # names the first module that pulled it in.
    code = (
        "import sys, importlib\n"
        f"for module in {modules(package)!r}:\n"
        "    importlib.import_module(module)\n"
        "    if 'torch' in sys.modules:\n"
        "        print(module, 'imported torch'); break\n"
        "else:\n"
        "    print('clean')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "clean"


def test_every_module_imports() -> None:
    # One fresh process, so a module that imports only because an earlier test loaded
    # something for it still fails here.
    code = (
        "import importlib, traceback\n"
        f"for module in {ALL_MODULES!r}:\n"
        "    try:\n"
        "        importlib.import_module(module)\n"
        "    except Exception:\n"
        "        print(module); traceback.print_exc()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr


def test_only_the_front_door_imports_upward() -> None:
    wrong = []
    for module in ALL_MODULES:
        if (
            not module.startswith("slo")
            or module == FRONT_DOOR
            or module.startswith(FRONT_DOOR + ".")
        ):
            continue
        for name in imported_names(module):
            if (
                name.split(".")[0] in UPWARD
                or name == FRONT_DOOR
                or name.startswith(FRONT_DOOR + ".")
            ):
                wrong.append(f"{module} imports {name}")
    assert wrong == []


@pytest.mark.parametrize("package", ["middleware", "dashboards", "alerts"])
def test_the_middle_floor_never_imports_the_front_door_or_the_engine(package: str) -> None:
    wrong = [
        f"{module} imports {name}"
        for module in modules(package)
        for name in imported_names(module)
        if name.split(".")[0] == "engine" or name.startswith(FRONT_DOOR)
    ]
    assert wrong == []


def test_no_import_cycle_outside_type_checking() -> None:
    # Edges between our own modules at run time (function-level imports too): a cycle here is
    # an import order that works only by luck.
    known = set(ALL_MODULES)
    graph = {
        module: {name for name in imported_names(module, type_checking=False) if name in known}
        - {module}
        for module in ALL_MODULES
    }
    cycles = []
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycles.append(" -> ".join([*path[path.index(module) :], module]))
            return
        if module in done:
            return
        for name in sorted(graph[module]):
            visit(name, [*path, module])
        done.add(module)

    for module in ALL_MODULES:
        visit(module, [])
    assert sorted(set(cycles)) == []


def test_building_the_whole_parser_imports_nothing_heavy() -> None:
    # The engine's policies (--scheduling's choices and help) and nothing else of it.
    code = (
        "import sys; import slo.cli; from slo.cli import build_parser; build_parser(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'engine', 'middleware', 'alerts', 'dashboards') "
        "and m != 'engine' and not m.startswith('engine.policies')), "
        "'engine.policies' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert result.stdout.strip() == "[] True", result.stderr


def test_the_engine_imports_its_names_when_they_are_used() -> None:
    # `import engine` and its policies without torch; every exported name, once asked for, is
    # the one its module defines.
    code = (
        "import sys, importlib, engine, engine.policies\n"
        "print('torch' in sys.modules)\n"
        "wrong = [n for n in engine.__all__ if getattr(engine, n) is not getattr("
        "importlib.import_module(engine._HOMES[n]), n)]\n"
        "print(sorted(engine._HOMES) == sorted(engine.__all__), wrong, 'torch' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.stdout.split("\n")[:2] == ["False", "True [] True"], result.stderr
