"""`slo bench --find-max-rate` against the bundled engine (`slo serve`, bundled:tiny on the
CPU): the search finishes in under 5 minutes on 2 cores, a step at the rate it found meets
the spec, and a step at 1.2x that rate does not.

The confirmation steps are run and judged exactly as the search's own steps are (warm-up,
a measured window of at least --min-window seconds, every per-request objective per tier).
Run alone, by hand, on a quiet machine (the engine and the load generator share its cores;
on a busy one the client falls behind and the steps say so):
    python -m pytest tests/benchmarks/test_capacity_engine.py -o addopts= -s -p no:cacheprovider
Writes docs/benchmarks/capacity-engine.md. The peer is the same server one fifth faster.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from slo.cli import main
from slo.cli.bench.client import RequestSettings
from slo.cli.bench.profiles import get_profile
from slo.cli.bench.step import StepShape, run_step
from slo.spec import SLOSpec
from tests.benchmarks.bench_record import ROOT, load_average, stamp, table, write_section
from tests.helpers.servers import slo_serve

SPEC = """
version: 1
min_events: 1
tiers:
  - name: premium
    priority: 0
    match: {header: x-llm-tier, values: [premium]}
    objectives: ["p90 ttft <= 250ms", "p90 tpot <= 100ms"]
  - name: standard
    priority: 1
    default: true
    match: {header: x-llm-tier, values: [standard]}
    objectives: ["p90 e2e <= 5s"]
"""
MIX = (("premium", 0.5), ("standard", 0.5))


def test_the_found_rate_holds_and_one_fifth_more_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    load_at_start = load_average()
    spec_path = tmp_path / "slo.yaml"
    spec_path.write_text(SPEC)
    out = tmp_path / "capacity"
    with slo_serve(
        "--model",
        "bundled:tiny",
        "--spec",
        str(spec_path),
        "--store",
        f"sqlite:///{tmp_path / 'records.db'}",
    ) as url:
        started = time.monotonic()
        code = main(
            [
                "bench",
                "--url",
                url,
                "--find-max-rate",
                "--spec",
                str(spec_path),
                "--profile",
                "voice",
                "--tier-mix",
                "premium=0.5,standard=0.5",
                "--tail-events",
                "3",
                "--min-window",
                "8",
                "--cooldown",
                "1",
                "--probe-concurrency",
                "8",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        took = time.monotonic() - started
        printed = capsys.readouterr().out
        assert code == 0, printed
        assert took < 300, f"the search took {took:.0f} s\n{printed}"
        document = json.loads((out / "capacity.json").read_text())
        found = document["max_rate"]
        window = document["window"]
        shape = StepShape(
            get_profile("voice"),
            MIX,
            window["warmup_requests"],
            window["measured_requests"],
            4096,
            100,
            1.0,
            min_window_s=window["min_window_s"],
        )
        settings = RequestSettings("bundled:tiny", "chat")
        spec = SLOSpec.load(spec_path)
        time.sleep(1)
        at = run_step(spec, shape, url, settings, 101, found, "rate")
        time.sleep(2)
        above = run_step(spec, shape, url, settings, 102, round(found * 1.2, 3), "rate")
    rows = [
        [f"{step.load:g}", step.verdict, step.goodput_rps, len(step.measured_records)]
        for step in (at, above)
    ]
    text = "\n".join(
        [
            stamp(load_at_start),
            f"search: {took:.0f} s, max_rate {found:g} req/s",
            "",
            table(["rate", "verdict", "goodput req/s", "measured"], rows),
        ]
    )
    print("\n" + printed + text)
    write_section(
        ROOT / "docs" / "benchmarks" / "capacity-engine.md",
        "slo bench --find-max-rate against the bundled engine",
        "capacity-engine",
        text,
    )
    assert at.verdict == "pass", (printed, at.to_dict())
    assert above.verdict == "fail", (printed, above.to_dict())
