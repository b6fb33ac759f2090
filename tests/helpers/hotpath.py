"""Running a test module against both per-event hot paths: the compiled `middleware._hotpath`
and the pure-Python `middleware._hotpath_py` (`middleware.hotpath` picks one per process).

A module that does `from tests.helpers.hotpath import each_hotpath  # noqa: F401` runs every
test once per implementation available here: the pure-Python one always, the compiled one when
it is built and `LLM_SLO_PURE_PYTHON=1` is not set. `using(name)` rebinds the hot functions
wherever the packages and the tests took them (module globals, class attributes), so a
WireReader, a RequestTimeline or a WindowSet made inside runs the chosen one.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest

from middleware import _hotpath_py, hotpath

ROOT = Path(__file__).resolve().parents[2]


def implementations() -> list[str]:
    """The implementations this process can run: the one `middleware.hotpath` chose, and the
    pure-Python one (the same thing where the compiled one is not built or not wanted)."""
    names = [_hotpath_py.IMPLEMENTATION]
    if hotpath.impl is not _hotpath_py:
        names.insert(0, hotpath.impl.IMPLEMENTATION)
    return names


def module_named(name: str) -> ModuleType:
    if name == _hotpath_py.IMPLEMENTATION:
        return _hotpath_py
    built = hotpath.compiled()
    if built is None:
        raise LookupError(f"hot path {name!r} is not built here: run `pip install -e .`")
    return built


def _ours(module: ModuleType) -> bool:
    path = getattr(module, "__file__", None) or ""
    return path.startswith(str(ROOT)) and "/.venv/" not in path and path.endswith(".py")


def _install(target: ModuleType) -> None:
    swaps = {id(getattr(hotpath, name)): getattr(target, name) for name in hotpath.HOT_FUNCTIONS}
    for module in list(sys.modules.values()):
        if module is None or module is _hotpath_py or not _ours(module):
            continue
        for key, value in list(vars(module).items()):
            if id(value) in swaps:
                setattr(module, key, swaps[id(value)])
            elif isinstance(value, type) and value.__module__ == module.__name__:
                for attr, member in list(vars(value).items()):
                    if id(member) in swaps:
                        setattr(value, attr, swaps[id(member)])
    hotpath.impl, hotpath.IMPLEMENTATION = target, target.IMPLEMENTATION


@contextmanager
def using(name: str) -> Iterator[ModuleType]:
    """Run the block on the named implementation ("compiled" or "pure-python")."""
    before = hotpath.impl
    _install(module_named(name))
    try:
        yield hotpath.impl
    finally:
        _install(before)


@pytest.fixture(scope="module", params=implementations(), autouse=True)
def each_hotpath(request: pytest.FixtureRequest) -> Iterator[str]:
    with using(request.param):
        yield request.param
