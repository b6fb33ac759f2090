"""`slo bench --runs N`: N runs into one file, each percentile with its interval over the runs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from slo.check.evaluate import nearest_rank
from slo.cli import main
from slo.cli.bench.runs import Spread, spreads, t_critical
from slo.spec import SLOSpec
from tests.helpers.scripted_server import scripted_app
from tests.helpers.servers import free_port, uvicorn_thread


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 9, 19, 29, 60, 200])
def test_the_t_critical_value_is_students(df: int) -> None:
    assert t_critical(df) == pytest.approx(stats.t.ppf(0.975, df), rel=1e-9)


def test_a_spreads_interval_is_the_t_interval_of_the_runs_mean() -> None:
    values = (0.120, 0.135, 0.128, 0.151)
    spread = Spread("premium", "TTFT p95", values)
    low, high = stats.t.interval(0.95, len(values) - 1, loc=spread.mean, scale=stats.sem(values))
    assert spread.interval == pytest.approx((low, high), rel=1e-9)
    assert Spread("premium", "TTFT p95", (0.120,)).interval is None  # one run: no interval
    wide = Spread("premium", "TTFT p95", (0.001, 0.200))
    assert wide.interval is not None and wide.interval[0] == 0.0  # no latency is negative


def bench(url: str, out: Path, *flags: str) -> int:
    argv = ["bench", "--url", url, "--profile", "code", "--requests", "4", "--quiet"]
    return main([*argv, "--out", str(out), *flags])


def by_run(out: Path) -> dict[int, list[dict[str, Any]]]:
    runs: dict[int, list[dict[str, Any]]] = {}
    for line in out.read_text().splitlines():
        record = json.loads(line)
        runs.setdefault(record["run"], []).append(record)
    return runs


def test_runs_give_each_percentile_an_interval_that_holds_every_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs.jsonl"
    with uvicorn_thread(scripted_app({})) as url:
        assert bench(url, out, "--rate", "40", "--runs", "3", "--seed", "7") == 0
    printed = capsys.readouterr().out
    runs = by_run(out)
    assert sorted(runs) == [1, 2, 3] and all(len(rows) == 4 for rows in runs.values())
    ids = [record["request_id"] for rows in runs.values() for record in rows]
    assert len(set(ids)) == 12  # one id per request of every run
    assert "run 3 of 3: 4 of 4 requests finished" in printed
    assert "per tier over 3 runs" in printed and "TTFT p95 from schedule" in printed
    found = {(s.tier, s.name): s for s in spreads(SLOSpec.default(), list(runs.values()))}
    views = (
        ("TTFT p95", "client_ttft_s", False),
        ("e2e p95", "client_e2e_s", False),
        ("TTFT p95 from schedule", "client_ttft_s", True),
    )
    for name, field, lag in views:
        each = []
        for rows in runs.values():  # each run's own p95, as its summary would print it
            values = [r[field] + (r["client_send_lag_s"] if lag else 0.0) for r in rows]
            each.append(nearest_rank(np.array(values), 0.95))
        spread = found[("standard", name)]
        assert spread.values == pytest.approx(tuple(each))
        assert all(min(spread.values) <= value <= max(spread.values) for value in each)
        interval = spread.interval
        assert interval is not None and interval[0] <= spread.mean <= interval[1]
        half = t_critical(2) * stats.tstd(each) / math.sqrt(3)
        assert interval == pytest.approx((max(0.0, spread.mean - half), spread.mean + half))


def test_one_run_writes_the_records_it_always_did(tmp_path: Path) -> None:
    out = tmp_path / "one.jsonl"
    with uvicorn_thread(scripted_app({})) as url:
        assert bench(url, out, "--concurrency", "2") == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 4
    assert all("run" not in r and "client_send_lag_s" not in r for r in records)  # closed loop


@pytest.mark.parametrize("runs", ["0", "-2"])
def test_fewer_than_one_run_is_a_one_line_usage_error(
    runs: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # never asked: the flag is refused first
    assert bench(url, tmp_path / "r.jsonl", "--runs", runs) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and f"--runs must be at least 1, got {runs}" in error
    assert "Traceback" not in error


def test_runs_are_for_a_plain_run_not_a_search(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert bench(url, tmp_path / "cap", "--find-max-rate", "--runs", "2") == 2
    assert "--runs repeats a plain run" in capsys.readouterr().err
