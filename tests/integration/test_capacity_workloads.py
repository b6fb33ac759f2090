"""`slo bench --trace` against a real server on 127.0.0.1: the trace's times (scaled) and tiers
are what the server sees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slo.cli import main
from tests.helpers.mooncake_trace import MOONCAKE, write_trace
from tests.helpers.slot_server import slot_server_process

pytestmark = pytest.mark.integration


def test_slo_bench_replays_a_trace_against_a_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(
        tmp_path, [dict(line, timestamp=line["timestamp"] / 100) for line in MOONCAKE]
    )
    out = tmp_path / "run.jsonl"
    with slot_server_process(8, 0.01) as url:
        code = main(
            [
                "bench",
                "--url",
                url,
                "--trace",
                str(trace),
                "--trace-scale",
                "2",
                "--tier-mix",
                "standard=1",
                "--out",
                str(out),
                "--quiet",
            ]
        )
    assert code == 0, capsys.readouterr().out
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["tier"] for r in records) == ["premium", "standard", "standard", "standard"]
    starts = sorted(r["timestamp"] for r in records)
    # 274.82 ms of trace at twice its rate: the last is sent ~137 ms after the first
    assert 0.130 <= starts[-1] - starts[0] <= 0.137 + 0.05
