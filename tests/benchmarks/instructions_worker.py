"""One measurement of tests/benchmarks/test_before_after_instructions.py, run under valgrind's
callgrind: `python instructions_worker.py TREE FRAMEWORK WORKLOAD VARIANT COUNT`.

TREE goes first on sys.path, so `middleware` and the workload (TREE's own apps and driver, the
same in both checkouts: see tree_workload.py for where each keeps them) are that checkout's. It
builds one app (`bare`, `tracing off` or `all on`, a peer for test_middleware_instructions.py,
or one of tests/helpers/genai_variants.py's VARIANTS), warms it up, collects garbage, then
drives COUNT requests inside `sys.call_tracing`: callgrind counts instructions only there
(`--toggle-collect=sys_call_tracing*`), so imports, set-up and warm-up are left out.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import tempfile
from pathlib import Path


def main() -> None:
    from tree_workload import workload as workload_of  # this script's folder, before TREE

    tree, framework, workload, variant, count = sys.argv[1:6]
    sys.path.insert(0, tree)
    import middleware

    overhead = workload_of(tree)

    for module in (middleware, overhead):
        if not str(module.__file__).startswith(tree):
            raise SystemExit(f"{module.__name__} came from {module.__file__}, not from {tree}")
    tmp = Path(tempfile.mkdtemp(prefix="instructions-"))
    variants = {
        "bare": overhead.bare,
        "tracing off": overhead.ours_tracing_off,
        "all on": overhead.ours_all_on,
        # the peers issue 29 names (tests/benchmarks/test_middleware_instructions.py)
        "starlette-exporter": overhead.starlette_exporter,
        "opentelemetry-instrumentation-asgi": overhead.otel_asgi_defaults,
    }
    if variant not in variants:  # the gen_ai variants (tests/helpers/genai_variants.py)
        from tests.helpers import genai_variants as genai

        variants.update(genai.VARIANTS)
    make = variants[variant]
    app = make(tmp, overhead.FRAMEWORKS[framework])
    path = "/v1/completions" if workload == "json" else "/v1/chat/completions"
    overhead.run_requests(app, path)  # lazy imports, label children, caches
    # What set-up and warm-up left for the collector is not the request path's: collect it,
    # and keep the survivors out of later collections, so counts repeat from run to run.
    gc.collect()
    gc.freeze()
    sys.call_tracing(asyncio.run, (overhead.drive(app, path, int(count)),))
    close = getattr(app, "close", None)
    if close is not None:
        close()


if __name__ == "__main__":
    main()
