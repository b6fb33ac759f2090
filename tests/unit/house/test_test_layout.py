"""No module under tests/ imports a test module (issue 41: tests stand on helpers, not on each
other). What tests share lives in tests/helpers/ or in a conftest.py fixture; a `test_*` module
is loaded by pytest alone, so one can change or go without breaking another.

Found with `ast`, in every .py file under tests/ (helpers, conftest.py files and benchmarks too):
import statements anywhere (inside functions too; relative ones resolved), `import_module` and
`__import__` given a literal name, a string that is a test module's dotted name (as `python -m`
is given one), and the code in string literals and f-strings that tests write out and run in a
child interpreter. A path in prose is no import; nor is a file of another checkout, which the
before/after benchmarks load from that checkout's folder (tests/benchmarks/tree_workload.py).

And tests/unit/ mirrors the source packages, so a module's tests are found where it lives: no
test module sits directly in tests/unit/, each folder there is a source package (the packages
pyproject.toml ships) or `house` (the rules of the repository as a whole), and each folder below
one mirrors a sub-package of it (tests/unit/slo/cli/ for slo/cli/).
"""

from __future__ import annotations

import ast
import re
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
TESTS = REPO / "tests"
UNIT = TESTS / "unit"
HOUSE = "house"  # tests of the repository as a whole: limits, imports, one source, this layout
DOTTED = re.compile(r"tests(?:\.\w+)+")  # a module of the suite, named as `-m` takes it


def is_test_module(name: str) -> bool:
    return any(part.startswith("test_") for part in name.split("."))


def _literal(node: ast.AST) -> str | None:
    """The text of a string literal; an f-string's fixed parts with a name for each field."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "_" for v in node.values)
    return None


def _as_code(text: str) -> ast.AST | None:
    """The string parsed as Python, when it is code that imports (else None)."""
    if "import" not in text:
        return None
    try:
        tree = ast.parse(textwrap.dedent(text))
    except SyntaxError:
        return None
    return tree if any(isinstance(n, ast.Import | ast.ImportFrom) for n in ast.walk(tree)) else None


def _imports_by_name(call: ast.Call) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in ("import_module", "__import__")


def imported(tree: ast.AST, module: str) -> Iterator[tuple[int, str]]:
    """(line, name) of every module the code of `module` imports, or names for importing."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from the module's package (__init__ counts as a module of it), up
                package = module.split(".")[: -node.level]
                base = ".".join([*package, *([base] if base else [])])
            yield node.lineno, base
            # `from tests.unit import test_x` imports the module test_x
            yield from ((node.lineno, f"{base}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Call) and _imports_by_name(node) and node.args:
            if (name := _literal(node.args[0])) is not None:
                yield node.lineno, name
        elif (text := _literal(node)) is not None:
            if DOTTED.fullmatch(text):
                yield node.lineno, text
            if (code := _as_code(text)) is not None:
                yield from ((node.lineno, name) for _, name in imported(code, module))


def module_name(path: Path, root: Path = TESTS) -> str:
    """The dotted name of a file under `root` (a tests/ folder, named from the folder above)."""
    return ".".join(path.relative_to(root.parent).with_suffix("").parts)


def violations(root: Path = TESTS) -> list[str]:
    """`path:line imports name` for each test module imported by a file under `root`."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root.parent)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, name in imported(tree, module_name(path, root)):
            if is_test_module(name):
                found.add(f"{relative.as_posix()}:{line} imports {name}")
    return sorted(found)


def test_the_walk_finds_the_suite_and_its_imports() -> None:
    # A walk that found nothing (a moved folder, a wrong root) would pass the check below.
    found = {path.relative_to(REPO).as_posix() for path in TESTS.rglob("*.py")}
    expected = ["conftest.py", "helpers/polling.py", "benchmarks/middleware_worker.py"]
    assert {f"tests/{name}" for name in expected} <= found and __file__.endswith(tuple(found))
    store = UNIT / "slo" / "test_store.py"
    tree = ast.parse(store.read_text(encoding="utf-8"))
    assert "tests.helpers.store_round_trip" in {n for _, n in imported(tree, module_name(store))}


def test_no_module_under_tests_imports_a_test_module() -> None:
    found = violations()
    assert not found, (
        f"modules importing test modules: {found}; move what they share to tests/helpers/ (a "
        "module named for what it holds) or to a conftest.py fixture, and import it from there"
    )


# Joined at run time: written out whole, these samples would be this module's own violations.
OTHER = "tests.unit." + "test_other"
SAMPLES = {
    "tests/unit/test_plain.py": "import OTHER\n",
    "tests/unit/test_in_function.py": "def f():\n    from OTHER import helper\n",
    "tests/unit/test_relative.py": "from . import " + "test_other\n",
    "tests/unit/test_from_package.py": "from tests.unit import " + "test_other\n",
    "tests/helpers/by_name.py": 'import importlib\nm = importlib.import_module("OTHER")\n',
    "tests/benchmarks/worker.py": 'command = ["python", "-m", "OTHER"]\n',
    "tests/integration/test_script.py": 'SCRIPT = """\nimport sys\nfrom OTHER import call\n"""\n',
    "tests/integration/test_fstring.py": 'code = f"from OTHER import serve; serve({port})"\n',
    "tests/e2e/test_indented.py": 'SCRIPT = """\n    import json\n    import OTHER\n"""\n',
}


def test_each_way_of_importing_a_test_module_is_found(tmp_path: Path) -> None:
    for name, source in SAMPLES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source.replace("OTHER", OTHER))
    clean = '"""Shared by tests/unit/test_other.py."""\nfrom tests.helpers import polling\n'
    (tmp_path / "tests" / "helpers" / "clean.py").write_text(clean)
    found = violations(tmp_path / "tests")
    assert {entry.split(":")[0] for entry in found} == set(SAMPLES), found  # clean.py is not
    assert {e.split(":")[0] for e in found if e.endswith(f" imports {OTHER}")} == set(SAMPLES)


def source_packages() -> list[str]:
    """The top-level packages the project ships (pyproject.toml's `packages.find.include`)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted(pattern.rstrip("*") for pattern in include)


def unit_folders() -> list[Path]:
    """Every folder under tests/unit/ (caches aside), parents before children."""
    return sorted(
        path
        for path in UNIT.rglob("*")
        if path.is_dir()
        and not any(part.startswith(("__", ".")) for part in path.relative_to(UNIT).parts)
    )


def test_no_test_module_sits_directly_in_tests_unit() -> None:
    loose = sorted(path.name for path in UNIT.glob("*.py") if path.name != "__init__.py")
    assert not loose, (
        f"{loose} directly in tests/unit/: move each under the folder of the package it mainly "
        f"tests (tests/unit/<package>/, as the package's path), or {HOUSE}/ for the repository"
    )


def test_tests_unit_mirrors_the_source_packages() -> None:
    packages = source_packages()
    assert {"engine", "middleware", "slo"} <= set(packages), packages
    folders = unit_folders()
    assert UNIT / "slo" / "cli" in folders and UNIT / HOUSE in folders  # the walk finds them
    stray = []
    for folder in folders:
        top, *below = folder.relative_to(UNIT).parts
        mirrors = top in packages and (REPO / top / Path(*below) / "__init__.py").is_file()
        if not (mirrors or (top == HOUSE and not below)):
            stray.append(folder.relative_to(REPO).as_posix())
    assert not stray, (
        f"{stray} mirror no source package: tests/unit/ holds one folder per package ({packages})"
        f" and {HOUSE}/; below one, a folder is named for a sub-package of it"
    )
    missing = [f.relative_to(REPO).as_posix() for f in folders if not (f / "__init__.py").is_file()]
    assert not missing, f"{missing} have no __init__.py (test modules are named by their path)"
