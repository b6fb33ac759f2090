"""Is the mounted middleware no slower than before, counted in CPU instructions? This checkout
against an earlier commit (the `trees` fixture, tests/benchmarks/conftest.py), each request path
run under valgrind's callgrind.

    python -m pytest tests/benchmarks/test_before_after_instructions.py -o addopts="" -s \
        -p no:cacheprovider

Why a second judge: on this shared 2-core machine the timed benchmark's identical pair (the same
code twice) reads 0.84-1.12, so it cannot tell 5% apart. An instruction count does not depend on
what else runs: it is the CPU work the request path asks for (not its cache misses or the
kernel's share; no socket is involved here, the apps are driven through ASGI in process).

Per checkout, framework (Starlette, FastAPI), workload (a JSON completion, a 32-chunk stream)
and variant (bare app, middleware with tracing off, with everything on): one process
(tests/benchmarks/instructions_worker.py) builds the app, warms it, then drives COUNT requests
inside `sys.call_tracing`, the only place callgrind counts (`PYTHONHASHSEED=0`). The
middleware's cost is its instructions per request minus the bare app's; the ratio is this
checkout's cost over the earlier one's. One variant runs twice in this checkout, to show how
far a count moves between identical runs. Goals: at most 1.05 with tracing off (issue 23: no
slower) and with everything on (issue 24 asks at most 1.10 there; issue 23's 1.05 is the
tighter). Writes its table to docs/benchmarks/before-after.md.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.benchmarks.bench_record import load_average, stamp, table, write_section
from tests.conftest import require_or_skip
from tests.helpers.before_after import BEFORE, PAGE, TITLE
from tests.helpers.callgrind_counts import COUNTS, instructions_per_request

VARIANTS = ("bare", "tracing off", "all on")
LIMIT = 1.05
Key = tuple[str, str, str, str]  # side, framework, workload, variant
HEADER = ["app", "workload", "middleware", "cost before", "cost now", "now / before", "met"]


@pytest.mark.timeout(3600)
def test_middleware_instructions_before_after(trees: dict[str, Path]) -> None:
    if shutil.which("valgrind") is None:
        require_or_skip("valgrind is not installed (apt-get install valgrind)")
    load_at_start = load_average()
    keys: list[Key] = [
        (side, framework, workload, variant)
        for side in ("before", "after")
        for framework in ("starlette", "fastapi")
        for workload in COUNTS
        for variant in VARIANTS
    ]
    again: Key = ("after", "starlette", "json", "all on")
    with ThreadPoolExecutor(max_workers=2) as pool:  # one valgrind per core
        counted = dict(zip(keys, pool.map(lambda key: measure(trees, key), keys), strict=True))
        repeat = pool.submit(measure, trees, again).result()
    rows, misses = [], []
    for framework in ("starlette", "fastapi"):
        for workload in COUNTS:
            for variant in VARIANTS[1:]:
                cost = {
                    side: counted[(side, framework, workload, variant)]
                    - counted[(side, framework, workload, "bare")]
                    for side in ("before", "after")
                }
                ratio = round(cost["after"] / cost["before"], 3)
                met = ratio <= LIMIT
                if not met:
                    misses.append(f"{framework} {workload} {variant}: {ratio}")
                rows.append(
                    [framework, workload, variant, f"{cost['before'] / 1e3:,.0f}k",
                     f"{cost['after'] / 1e3:,.0f}k", ratio, "yes" if met else "**no**"]
                )  # fmt: skip
    spread = round(repeat / counted[again], 4)
    print("\n" + "\n".join(str(row) for row in rows) + f"\nsame run twice: {spread}")
    write_section(PAGE, TITLE, "middleware-instructions", page(rows, spread, load_at_start))
    assert not misses, f"more instructions than before: {misses}"


def measure(checkouts: dict[str, Path], key: Key) -> float:
    side, framework, workload, variant = key
    return instructions_per_request(checkouts[side], framework, workload, variant)


def page(rows: list[list[object]], spread: float, load_at_start: str) -> str:
    return "\n".join(
        [
            "## The mounted middleware in CPU instructions, against the code before",
            "",
            stamp(load_at_start),
            "",
            f"Against `{BEFORE}`; instructions per request counted by valgrind's callgrind on "
            "the request path alone (the apps driven through ASGI in process), the bare app's "
            f"subtracted; {COUNTS['json']} JSON requests, {COUNTS['sse-32']} streams per "
            "count. Goal: this checkout's cost at most "
            f"{LIMIT}x the earlier one's. One count run twice reads {spread} (now / then). "
            "Command: `python -m pytest tests/benchmarks/test_before_after_instructions.py "
            '-o addopts="" -s -p no:cacheprovider`.',
            "",
            table(HEADER, rows),
        ]
    )
