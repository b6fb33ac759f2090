"""One measurement of tests/benchmarks/test_before_after_instructions.py, run under valgrind's
callgrind: `python instructions_worker.py TREE FRAMEWORK WORKLOAD VARIANT COUNT`.

TREE goes first on sys.path, so `middleware` and the workload (TREE's own
tests/benchmarks/test_middleware_overhead.py: the same apps and driver in both checkouts) are
that checkout's. It builds one app (`bare`, `tracing off` or `all on`, a peer for
test_middleware_instructions.py, or one of test_genai_overhead.py's VARIANTS), warms it up,
collects garbage, then
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
    tree, framework, workload, variant, count = sys.argv[1:6]
    sys.path.insert(0, tree)
    import middleware
    from tests.benchmarks import test_middleware_overhead as overhead

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
    if variant not in variants:  # this checkout's gen_ai variants (test_genai_overhead.py)
        from tests.benchmarks import test_genai_overhead as genai

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
