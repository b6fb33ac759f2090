"""Instructions per request of one middleware variant, counted by valgrind's callgrind: one
process (tests/benchmarks/instructions_worker.py) builds the app from a checkout's own code,
warms it, then drives COUNTS[workload] requests inside `sys.call_tracing`, the only place
callgrind counts (`PYTHONHASHSEED=0`, so counts repeat from run to run)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = Path(__file__).resolve().parents[1] / "benchmarks" / "instructions_worker.py"
COUNTS = {"json": 300, "sse-32": 100}  # requests per measurement


def instructions_per_request(tree: Path, framework: str, workload: str, variant: str) -> float:
    """Instructions the request path ran per request (callgrind's total over COUNT)."""
    count = COUNTS[workload]
    with tempfile.TemporaryDirectory(prefix="callgrind-") as folder:
        out = Path(folder) / "callgrind.out"
        command = [
            "valgrind",
            "--tool=callgrind",
            "--collect-atstart=no",
            "--toggle-collect=sys_call_tracing*",
            f"--callgrind-out-file={out}",
            sys.executable,
            str(WORKER),
            str(tree),
            framework,
            "json" if workload == "json" else "sse",
            variant,
            str(count),
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tree)
        assert done.returncode == 0, done.stderr[-3000:]
        totals = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.M)
        assert totals, f"no totals in callgrind's output for {tree} {variant}"
    return int(totals.group(1)) / count
