"""`slo bench --find-max-rate` against a server whose capacity is known: K slots, each request
holding one for T seconds (tests/helpers/slot_server.py), so it serves K / T requests/s.

With constant arrivals nothing queues below K / T and the queue grows without bound above
it, so each tier's TTFT objective gives way right at K / T (waits grow by (rate T / K - 1)
per second of the step: 5% over, the last tenth of a 3 s step waits > 130 ms, far past the
50 ms allowed, while the machine's own jitter stays under it). The search must land within
5% of K / T in at most 10 steps, and name the objective that bound each tier.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slo.cli import main
from slo.records import read_jsonl
from tests.helpers.slot_server import slot_server_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPEC = """
version: 1
min_events: 1
tiers:
  - name: premium
    match: {header: x-llm-tier, values: [premium]}
    objectives: ["p90 ttft <= 50ms", "p90 e2e <= 1s"]
  - name: standard
    default: true
    match: {header: x-llm-tier, values: [standard]}
    objectives: ["p90 e2e <= 2s"]
"""


@pytest.mark.parametrize(("slots", "hold_s"), [(4, 0.1), (2, 0.04)])
def test_the_search_finds_k_over_t(
    slots: int, hold_s: float, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "slo.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "capacity"
    with slot_server_process(slots, hold_s) as url:
        code = main(
            [
                "bench",
                "--url",
                url,
                "--find-max-rate",
                "--spec",
                str(spec),
                "--profile",
                "voice",
                "--tier-mix",
                "premium=0.5,standard=0.5",
                "--arrival",
                "constant",
                "--tail-events",
                "5",
                "--cooldown",
                "0.3",
                "--min-window",
                "2",
                "--out",
                str(out),
                "--quiet",
            ]
        )
    printed = capsys.readouterr().out
    assert code == 0, printed
    document = json.loads((out / "capacity.json").read_text())
    capacity = slots / hold_s
    assert abs(document["max_rate"] / capacity - 1) <= 0.05, printed
    assert len(document["steps"]) <= 10, printed
    assert document["saturation_probe"]["finished_rps"] == pytest.approx(capacity, rel=0.05)
    premium = document["per_tier"]["premium"]
    assert premium["binding_objective"] == "p90 ttft <= 50ms", printed
    assert premium["max_rate"] == document["max_rate"]
    # standard (a 2 s bound on e2e) is never the one to give way first
    assert document["per_tier"]["standard"]["max_rate"] >= document["max_rate"]
    failed = [s for s in document["steps"] if s["verdict"] == "fail"]
    assert failed and all(s["stopped_early"] for s in failed if s["rate"] > 1.2 * capacity)
    for step in document["steps"]:
        records = read_jsonl(out / step["records"])
        assert len(records) == step["measured_requests"]
        if step["verdict"] == "pass":
            assert len(records) >= document["window"]["measured_requests"]
            assert step["lateness"]["behind"] is False
    assert f"max_rate: {document['max_rate']:g} requests/s" in printed
