"""`slo plan`'s arithmetic against cases worked by hand, and the command's output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slo.capacity.plan import (
    cost_of,
    hourly,
    knobs,
    mix_warnings,
    parse_diurnal,
    plan_day,
    replicas_for,
)
from slo.cli import main
from slo.errors import UsageError


def test_replicas_and_cost_worked_by_hand() -> None:
    # 40 req/s a replica, 20% kept free: 32 usable; 100 req/s needs 100 / 32 = 3.125 -> 4.
    plan = replicas_for(100, 40, 0.2)
    assert plan.replicas == 4
    assert plan.achieved_headroom == pytest.approx(1 - 100 / 160)  # 0.375
    # $2 a replica-hour: $8/h; 100 req/s x 50 tokens x 3600 s = 18 M tokens/h: $0.4444/M;
    # the floor, one replica at 40 req/s: 40 x 50 x 3600 = 7.2 M tokens for $2: $0.2778/M.
    cost = cost_of(plan, 2.0, 50)
    assert cost.per_hour == 8.0
    assert cost.per_million_output_tokens == pytest.approx(8 / 18)
    assert cost.floor_per_million_output_tokens == pytest.approx(2 / 7.2)


def test_an_exact_fit_takes_no_extra_replica_and_small_loads_take_one() -> None:
    assert replicas_for(96, 40, 0.2).replicas == 3  # 96 / 32 = 3 exactly
    assert replicas_for(96.01, 40, 0.2).replicas == 4
    assert replicas_for(0.5, 40, 0.2).replicas == 1
    assert replicas_for(40, 40, 0.0).achieved_headroom == 0.0
    with pytest.raises(UsageError, match="--headroom must be in"):
        replicas_for(1, 40, 1.0)


def test_a_day_is_planned_hour_by_hour() -> None:
    # 10 req/s from midnight, 50 from 08:00, 20 from 20:00, 32 usable a replica:
    # 8 h x 1 + 12 h x 2 + 4 h x 1 = 36 replica-hours, against 2 x 24 = 48 at the peak.
    points = parse_diurnal("0=10,8=50,20=20")
    assert hourly(points)[:9] == [10] * 8 + [50]
    day = plan_day(points, 40, 0.2)
    assert (day.peak_replicas, day.replica_hours, day.static_replica_hours) == (2, 36, 48)
    # a profile that starts after midnight wraps: 00:00-06:00 holds the 18:00 rate
    assert hourly(parse_diurnal("6=5,18=70"))[:7] == [70] * 6 + [5]


@pytest.mark.parametrize("text", ["24=5", "8:30=4", "noon=5", ""])
def test_bad_days_are_refused_by_name(text: str) -> None:
    with pytest.raises(UsageError, match="--diurnal"):
        parse_diurnal(text)


def test_a_target_mix_unlike_the_measured_one_is_warned_of() -> None:
    measured = {"premium": 0.5, "standard": 0.5}
    assert mix_warnings({"premium": 50, "standard": 55}, measured) == []
    warnings = mix_warnings({"premium": 90, "standard": 10}, measured)
    assert len(warnings) == 2 and "tier premium: 90% of the target but 50%" in warnings[0]


def test_knobs_come_from_serve_flags_and_the_servers_scheduling() -> None:
    document = {
        "engine": {
            "policy": "slo",
            "max_batch_size": 64,
            "serve_args": ["--quantization=int8", "--max-batch-size", "16"],
        }
    }
    assert knobs(document) == {"quantization": "int8", "scheduling": "slo", "max_batch_size": 16}
    assert knobs({"engine": {"policy": "fifo", "max_batch_size": 8}})["quantization"] == "none"
    assert knobs({"engine": {}}) == {
        "quantization": None,
        "scheduling": None,
        "max_batch_size": None,
    }


def _capacity(path: Path, max_rate: float, tokens: float, serve_args: list[str]) -> Path:
    step = {"rate": max_rate, "verdict": "pass", "mean_output_tokens": tokens, "tiers": {}}
    document = {
        "version": 1,
        "mode": "rate",
        "max_rate": max_rate,
        "steps": [step],
        "workload": {"tier_mix": {"premium": 0.5, "standard": 0.5}},
        "engine": {"policy": "slo", "max_batch_size": 64, "serve_args": serve_args},
    }
    path.mkdir()
    (path / "capacity.json").write_text(json.dumps(document))
    return path


def test_the_command_compares_runs_that_differ_in_a_knob(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _capacity(tmp_path / "fp32", 40, 50, [])
    int8 = _capacity(tmp_path / "int8", 60, 50, ["--quantization=int8"])
    code = main(
        ["plan", str(base), str(int8), "--rate", "premium=50,standard=50", "--price", "2", "--json"]
    )
    assert code == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    # 100 / 32 -> 4 replicas ($8/h); 100 / 48 -> 3 replicas ($6/h), the same 18 M tokens/h.
    assert [p["replicas"] for p in plans] == [4, 3]
    assert [p["cost_per_hour"] for p in plans] == [8.0, 6.0]
    assert plans[1]["cost_per_million_output_tokens"] == pytest.approx(6 / 18, abs=1e-4)
    main(["plan", str(base), str(int8), "--peak-rate", "100", "--price", "2"])
    text = capsys.readouterr().out
    assert (
        "against the first: max_rate +50%, replicas -1, cost per million output tokens -25% "
        "(quantization none -> int8)" in text
    )


def test_a_concurrency_run_cannot_be_planned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "capacity.json").write_text(json.dumps({"mode": "concurrency", "steps": []}))
    assert main(["plan", str(tmp_path), "--peak-rate", "10"]) == 2
    assert "no max_rate to plan from" in capsys.readouterr().err
