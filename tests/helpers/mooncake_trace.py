"""A Mooncake-format trace (what `slo bench --trace` replays) and writing one to a file."""

from __future__ import annotations

import json
from pathlib import Path

# The first lines of AIPerf's Mooncake example (aiperf docs/benchmark_modes/trace_replay.md),
# a tier added to one, and a line in seconds.
MOONCAKE = [
    {"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]},
    {
        "timestamp": 10535,
        "input_length": 672,
        "output_length": 26,
        "hash_ids": [46, 47],
        "tier": "premium",
    },
    {"timestamp": 27482, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]},
    {"timestamp": 5000, "input_length": 300, "output_length": 8, "hash_ids": [48]},
]


def write_trace(tmp_path: Path, lines: list[object]) -> Path:
    """The lines as a JSONL trace file in `tmp_path`."""
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path
