"""Where a checkout keeps the middleware workload that the before/after workers time (its apps,
variants and driver): tests/helpers/middleware_workload.py, or, in a commit from before it moved
there (issue 41), that commit's tests/benchmarks/test_middleware_overhead.py.

The workers (middleware_worker.py, instructions_worker.py) import this from their own folder
before they put TREE first on sys.path, so this module is this checkout's; what it loads is
TREE's.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def workload(tree: str) -> ModuleType:
    """TREE's workload module; TREE must already be first on sys.path."""
    root = Path(tree)
    if (root / "tests" / "helpers" / "middleware_workload.py").exists():
        return importlib.import_module("tests.helpers.middleware_workload")
    # An earlier commit's own file, as that commit ran it: loaded from its path, since no module
    # of this checkout holds that commit's code.
    path = root / "tests" / "benchmarks" / "test_middleware_overhead.py"
    spec = importlib.util.spec_from_file_location("earlier_middleware_workload", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{tree} has no middleware workload: neither helper nor {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
