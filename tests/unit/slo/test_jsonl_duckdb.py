"""`slo check --results` counted in DuckDB: the same report as the reference reader, exactly,
and the reference reader (with its file:line error) for anything DuckDB cannot vouch for."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from slo import records
from slo.check.evaluate import columns_needed, evaluate
from slo.check.jsonl_duckdb import REQUIRED_NUMBERS, WHOLE_NUMBERS, evaluate_jsonl
from slo.spec import SLOSpec
from slo.store.columns import load_jsonl_columns
from tests.helpers.record_samples import START, sample_records, write_sample_file
from tests.helpers.tier_specs import make_tier, spec_yaml

pytest.importorskip("duckdb")

# Thresholds the boundary records below sit exactly on (< and <=), a goodput objective, a
# ratio objective whose good count sits exactly on its target, strays and throughput.
SPEC = """
window: 1d
min_events: 1
tiers:
  - name: premium
    default: true
    objectives:
      - p95 ttft <= 200ms
      - 90% of requests tpot < 40ms
      - goodput >= 90%
      - p99 e2e <= 2s
      - availability >= 99%
  - name: standard
    objectives: [p50 ttft < 200ms, availability >= 97%, throughput >= 10 tokens/s,
                 90% of requests ttft <= 150ms]
  - name: batch
    objectives: [p99 e2e <= 30s, goodput >= 99%, p90 queue <= 1ms]
alert_policy:
  min_events: 1
  burn_rates:
    - {severity: page, long: 1h, short: 5m, factor: 14.4}
    - {severity: ticket, long: 1d, short: 2h, factor: 1}
"""


def reference(spec: SLOSpec, path: Path) -> dict[str, Any]:
    return evaluate(spec, load_jsonl_columns(path, columns_needed(spec))).to_dict()


def counted(spec: SLOSpec, path: Path) -> dict[str, Any]:
    report = evaluate_jsonl(spec, path)
    assert report is not None, "DuckDB declined input the reference reader accepts"
    return report.to_dict()


def boundary_records(count: int, seed: int) -> list[dict[str, Any]]:
    """Sample records with values exactly on the spec's thresholds, strays, records outside
    the window (before it and after the last end) and client views."""
    rng = np.random.default_rng(seed)
    rows = sample_records(count, seed)
    for i, row in enumerate(rows):
        pick = rng.integers(0, 8)
        if pick == 0:
            row["ttft_s"] = 0.2  # exactly on "<= 200ms" and "< 200ms"
        elif pick == 1 and "tpot_s" in row:
            row["tpot_s"] = 0.04
        elif pick == 2:
            row["ttft_s"] = 0.15
        elif pick == 3:
            row["queue_s"] = 0.001
        if i % 97 == 0:
            row["tier"] = "gold"  # not in the spec
        if i % 89 == 0:
            row["timestamp"] = START - 2 * 86400.0  # long before the window
        if i % 13 == 0:
            row["client_tpot_s"] = 0.04
    return rows


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_same_report_as_the_reference_reader(tmp_path: Path, seed: int) -> None:
    spec = _spec(tmp_path)
    path = write_sample_file(boundary_records(3000, seed), tmp_path / "run.jsonl")
    assert counted(spec, path) == reference(spec, path)


def test_same_report_on_the_default_spec_and_exact_doubles(tmp_path: Path) -> None:
    """Full-precision doubles (17 digits) read back bit for bit; the example spec's seven
    alert windows."""
    rng = np.random.default_rng(7)
    rows = sample_records(2000, 7)
    for row, noise in zip(rows, rng.random(len(rows)), strict=True):
        row["ttft_s"] = float(noise) / 3
        row["timestamp"] = START + float(noise) * 86400.0
    path = write_sample_file(rows, tmp_path / "run.jsonl")
    spec = SLOSpec.default()
    assert counted(spec, path) == reference(spec, path)


def test_a_good_count_exactly_on_the_target(tmp_path: Path) -> None:
    """999 good of 1000 at 99.9%: met by both, the one bad event at the threshold's edge."""
    rows = [
        {"request_id": f"r{i}", "tier": "premium", "timestamp": START + i, "e2e_s": 1.0,
         "ttft_s": 0.2 if i else 0.2000000001}
        for i in range(1000)
    ]  # fmt: skip
    path = write_sample_file(rows, tmp_path / "run.jsonl")
    spec = _spec(
        tmp_path, "tiers:\n- name: premium\n  objectives: [99.9% of requests ttft <= 200ms]\n"
    )
    report = counted(spec, path)
    assert report == reference(spec, path)
    objective = report["tiers"][0]["objectives"][0]
    assert (objective["events"], objective["good"], objective["verdict"]) == (1000, 999, "met")


BAD_LINES = {
    "truncated": '{"request_id": "x", "tier": "premium", "timestamp": 1',
    "string number": '{"request_id": "x", "tier": "premium", "timestamp": 1, "e2e_s": "0.5"}',
    "boolean number": '{"request_id": "x", "tier": "premium", "timestamp": 1, "e2e_s": true}',
    "number tier": '{"request_id": "x", "tier": 5, "timestamp": 1, "e2e_s": 0.5}',
    "list tier": '{"request_id": "x", "tier": ["premium"], "timestamp": 1, "e2e_s": 0.5}',
    "NaN literal": '{"request_id": "x", "tier": "premium", "timestamp": 1, "e2e_s": NaN}',
    "infinite": '{"request_id": "x", "tier": "premium", "timestamp": 1, "e2e_s": 1e999}',
    "negative": '{"request_id": "x", "tier": "premium", "timestamp": 1, "e2e_s": -0.5}',
    "unknown outcome": '{"request_id": "x", "tier": "premium", "timestamp": 1, "e2e_s": 0.5, '
    '"outcome": "fine"}',
    "fractional tokens": '{"request_id": "x", "tier": "premium", "timestamp": 1, "e2e_s": 0.5, '
    '"output_tokens": 12.0}',
    "no request_id": '{"tier": "premium", "timestamp": 1, "e2e_s": 0.5}',
    "number request_id": '{"request_id": 7, "tier": "premium", "timestamp": 1, "e2e_s": 0.5}',
    "two objects": '{"request_id": "x", "tier": "premium", "timestamp": 1, "e2e_s": 0.5} '
    '{"request_id": "y", "tier": "premium", "timestamp": 1, "e2e_s": 0.5}',
    "not an object": "[1, 2]",
    "not UTF-8": '{"request_id": "x\xff", "tier": "premium", "timestamp": 1, "e2e_s": 0.5}',
}


@pytest.mark.parametrize("name", sorted(BAD_LINES))
def test_a_bad_line_is_left_to_the_reference_reader(tmp_path: Path, name: str) -> None:
    path = tmp_path / "run.jsonl"
    good = [json.dumps(row) for row in sample_records(5)]
    path.write_bytes("\n".join([*good[:3], BAD_LINES[name], *good[3:]]).encode("latin-1") + b"\n")
    assert evaluate_jsonl(SLOSpec.default(), path) is None
    result = _slo("check", "--results", str(path))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{path}:4" in lines[0], result.stderr


def test_a_path_with_glob_characters_is_read_as_named(tmp_path: Path) -> None:
    """`run[1].jsonl` as a glob names `run1.jsonl`: a decoy there with other records must not
    be what `slo check` judges. The report is the reference reader's on the named file, and
    the exit code its verdict (the decoy's would be the other one)."""
    spec = _spec(tmp_path, spec_yaml(make_tier("premium", "p50 ttft <= 300ms", match=None)))
    rows = [r | {"tier": "premium"} for r in sample_records(50)]
    path = write_sample_file(rows, tmp_path / "run[1].jsonl")
    slow = [r | {"ttft_s": 1.0, "e2e_s": r["e2e_s"] + 1.0} for r in rows[:7]]
    write_sample_file(slow, tmp_path / "run1.jsonl")
    assert evaluate_jsonl(spec, path) is None  # the reference reader reads it
    want = reference(spec, path)
    assert want["records"] == 50 and want["all_met"] is True
    spec_path = str(tmp_path / "slo.yaml")
    result = _slo("check", "--spec", spec_path, "--results", str(path), "--format", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout) == want


def test_the_record_format_lists_match_slo_records() -> None:
    assert REQUIRED_NUMBERS == records.REQUIRED_FLOAT
    assert WHOLE_NUMBERS == records.INT_FIELDS


def test_check_results_loads_no_sqlalchemy(tmp_path: Path) -> None:
    path = write_sample_file(sample_records(50), tmp_path / "run.jsonl")
    code = (
        "import sys, os\nfrom slo.cli import main\n"
        f"main(['check', '--results', {str(path)!r}, '-o', os.devnull])\n"
        "print(sorted(m for m in ('sqlalchemy', 'sqlmodel') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "[]", result.stderr


def _spec(tmp_path: Path, text: str = SPEC) -> SLOSpec:
    path = tmp_path / "slo.yaml"
    path.write_text(text)
    return SLOSpec.load(str(path))


def _slo(*args: str) -> subprocess.CompletedProcess[str]:
    executable = shutil.which("slo")
    if executable is None:
        pytest.fail("the `slo` console script is not on PATH; run `pip install -e .`")
    return subprocess.run([executable, *args], capture_output=True, text=True, timeout=120)
