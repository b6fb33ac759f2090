"""One side of tests/benchmarks/test_before_after.py: the middleware of one checkout, timed on
command. Started as `python middleware_worker.py TREE FRAMEWORK WORKLOAD`; TREE goes first on
sys.path, so `middleware` and the workload (TREE's own apps and driver, the same in both
checkouts: see tree_workload.py for where each keeps them) are that checkout's.

It builds the bare app, the middleware with tracing off and with everything on, warms each up,
prints `ready`, then for each line naming a variant runs one round of its requests and prints
the seconds per request.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    from tree_workload import workload as workload_of  # this script's folder, before TREE

    tree, framework, workload = sys.argv[1:4]
    sys.path.insert(0, tree)
    import middleware

    overhead = workload_of(tree)

    for module in (middleware, overhead):
        if not str(module.__file__).startswith(tree):
            raise SystemExit(f"{module.__name__} came from {module.__file__}, not from {tree}")
    tmp = Path(tempfile.mkdtemp(prefix="before-after-"))
    make_app = overhead.FRAMEWORKS[framework]
    apps = {
        "bare": overhead.bare(tmp, make_app),
        "tracing off": overhead.ours_tracing_off(tmp, make_app),
        "all on": overhead.ours_all_on(tmp, make_app),
    }
    path = "/v1/completions" if workload == "json" else "/v1/chat/completions"
    for app in apps.values():
        overhead.run_requests(app, path)  # lazy imports, label children, caches
    print("ready", flush=True)
    for line in sys.stdin:
        app = apps[line.strip()]
        started = time.perf_counter()
        overhead.run_requests(app, path)
        print((time.perf_counter() - started) / overhead.REQUESTS_PER_ROUND, flush=True)


if __name__ == "__main__":
    main()
