"""Fixtures of the benchmarks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers.before_after import BEFORE, ROOT, build_hot_path, export


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """This checkout (HEAD) and the earlier commit BEFORE, exported side by side, per module."""
    base = tmp_path_factory.mktemp("trees")
    after = export("HEAD", base / "after")
    # This checkout's compiled hot path, as `pip install -e .` built it (git keeps no builds):
    # the code it measures is what users run.
    for built in (ROOT / "middleware").glob("_hotpath*.so"):
        shutil.copy(built, after / "middleware" / built.name)
    before = export(BEFORE, base / "before")
    build_hot_path(before, base / "wheel")
    return {"before": before, "after": after}
