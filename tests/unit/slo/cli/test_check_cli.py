"""`slo check`, `slo lint` and `slo init` through the installed console script."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from slo.store import RecordStore
from tests.helpers.record_samples import sample_records, write_sample_file
from tests.helpers.tier_specs import make_tier, spec_yaml

REPO = Path(__file__).resolve().parents[4]
STRICT = spec_yaml(
    make_tier("premium", "p99 ttft <= 1ms", "availability >= 90%", default=True), window=None
)


def lenient(tier: str = "premium", **options: Any) -> str:
    """A spec the sample records meet: one default tier, `options` as `spec_yaml` takes them."""
    objectives = ("p50 ttft <= 10s", "availability >= 90%")
    return spec_yaml(make_tier(tier, *objectives, default=True), window=None, **options)


def slo(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    executable = shutil.which("slo")
    if executable is None:
        pytest.fail("the `slo` console script is not on PATH; run `pip install -e .`")
    return subprocess.run(
        [executable, *args], capture_output=True, text=True, timeout=120, cwd=cwd or REPO
    )


@pytest.fixture(scope="module")
def run_jsonl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    records = [r | {"tier": "premium"} for r in sample_records(600)]
    return write_sample_file(records, tmp_path_factory.mktemp("run") / "run.jsonl")


def spec_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "slo.yaml"
    path.write_text(text)
    return str(path)


def test_exit_0_when_every_objective_is_met(run_jsonl: Path, tmp_path: Path) -> None:
    result = slo("check", "--spec", spec_file(tmp_path, lenient()),
                 "--results", str(run_jsonl))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "p50 ttft <= 10s" in result.stdout and "✅ met" in result.stdout
    assert "client saw them for 86 of 600 records" in result.stdout


def test_exit_1_when_an_objective_is_violated_and_json_says_why(
    run_jsonl: Path, tmp_path: Path
) -> None:
    result = slo("check", "--spec", spec_file(tmp_path, STRICT), "--results", str(run_jsonl),
                 "--format", "json")  # fmt: skip
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    verdicts = {o["objective"]: o["verdict"] for o in report["tiers"][0]["objectives"]}
    assert verdicts == {"p99 ttft <= 1ms": "violated", "availability >= 90%": "met"}
    assert report["all_met"] is False and report["records"] == 600


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["check", "--results", "missing.jsonl"], "--results missing.jsonl: no such file"),
        (["check"], "give exactly one of --results"),
        (["check", "--spec", "nope.yaml", "--results", "x"], "nope.yaml: file not found"),
        (
            ["check", "--db", "sqlite:///{tmp}/x.db", "--since", "3"],
            "--since: duration '3' has no unit",
        ),
        (["lint", "{tmp}/bad.yaml"], "bad.yaml:3: tier 'gold': unknown SLI 'ttfb'"),
    ],
)
def test_exit_2_on_bad_input_with_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("tiers:\n- name: gold\n  objectives: [p95 ttfb <= 2s]\n")
    result = slo(*[arg.replace("{tmp}", str(tmp_path)) for arg in args])
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_bad_record_line_is_exit_2(tmp_path: Path) -> None:
    path = write_sample_file(sample_records(3), tmp_path / "run.jsonl")
    path.write_text(path.read_text() + '{"request_id": "x"}\n')
    result = slo("check", "--results", str(path))
    assert result.returncode == 2
    assert f"{path}:4: missing field 'tier'" in result.stderr


def test_strict_fails_on_insufficient_data(run_jsonl: Path, tmp_path: Path) -> None:
    spec = spec_file(tmp_path, lenient(min_events=100000))
    assert slo("check", "--spec", spec, "--results", str(run_jsonl)).returncode == 0
    strict = slo("check", "--spec", spec, "--results", str(run_jsonl), "--strict", "--format",
                 "junit")  # fmt: skip
    assert strict.returncode == 1
    root = ET.fromstring(strict.stdout)
    assert root.get("failures") == "2"


def test_junit_validates_as_junit(run_jsonl: Path, tmp_path: Path) -> None:
    output = tmp_path / "slo.xml"
    result = slo("check", "--results", str(run_jsonl), "--format", "junit", "-o", str(output))
    assert result.returncode == 1 and result.stdout == ""  # the example's premium tier fails
    root = ET.parse(output).getroot()
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["tier premium", "tier standard", "tier batch"]
    total = failures = skipped = 0
    for suite in suites:
        cases = suite.findall("testcase")
        assert cases and all(c.get("name") and c.get("classname") for c in cases)
        assert all(child.tag == "testcase" for child in suite)
        case_failures = sum(len(c.findall("failure")) for c in cases)
        case_skips = sum(len(c.findall("skipped")) for c in cases)
        assert suite.get("tests") == str(len(cases))
        assert suite.get("failures") == str(case_failures)
        assert suite.get("skipped") == str(case_skips)
        for failure in suite.iter("failure"):
            assert failure.get("message") and failure.get("type")
        total, failures, skipped = (
            total + len(cases),
            failures + case_failures,
            skipped + case_skips,
        )
    assert (root.get("tests"), root.get("failures")) == (str(total), str(failures))
    assert failures >= 1 and skipped == 5  # standard and batch get no records here


def test_markdown_for_a_job_summary(run_jsonl: Path) -> None:
    result = slo("check", "--results", str(run_jsonl), "--format", "markdown")
    assert result.stdout.startswith("## SLO check")
    assert "| `p95 ttft <= 200ms` |" in result.stdout


def test_check_reads_a_record_store(tmp_path: Path) -> None:
    now = time.time()
    records = [r | {"tier": "premium", "timestamp": now - 60 + i * 0.01}
               for i, r in enumerate(sample_records(300))]  # fmt: skip
    url = f"sqlite:///{tmp_path / 'records.db'}"
    with RecordStore(url) as store:
        store.add_many(records)
    spec = spec_file(tmp_path, lenient())
    result = slo("check", "--spec", spec, "--db", url, "--since", "1h", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["records"] == 300


# (server errors, slow first tokens) of 400 requests -> exit code, verdicts. Availability >= 98%
# allows 8 errors of 400 (392 is exactly 98%), not 9; 95% within 500 ms allows 20 slow of 400.
OPENSLO_CASES = {
    "both met at the edge": (8, 10, 0, ("met", "met")),
    "one error too many": (9, 10, 1, ("violated", "met")),
    "slow first tokens": (0, 30, 1, ("met", "violated")),
}


@pytest.mark.parametrize("case", list(OPENSLO_CASES))
def test_openslo_example_imports_and_checks(tmp_path: Path, case: str) -> None:
    errors, slow, exit_code, verdicts = OPENSLO_CASES[case]
    records = []
    for index, record in enumerate(sample_records(400)):
        ttft = 0.9 if index % 40 < slow * 40 // 400 else 0.1  # the slow ones, spread out
        records.append(
            record
            | {"tier": "default", "outcome": "server_error" if index < errors else "ok"}
            | {"ttft_s": ttft, "e2e_s": max(record["e2e_s"], ttft + 0.05)}
        )
    assert sum(r["ttft_s"] > 0.5 for r in records) == slow
    run = write_sample_file(records, tmp_path / "run.jsonl")
    spec = "slo/examples/openslo.yaml"
    result = slo("check", "--spec", spec, "--results", str(run), "--format", "json")
    assert result.returncode == exit_code, result.stdout + result.stderr
    objectives = json.loads(result.stdout)["tiers"][0]["objectives"]
    assert [(o["objective"], o["verdict"]) for o in objectives] == list(
        zip(["availability >= 98%", "95% of requests ttft <= 500ms"], verdicts, strict=True)
    )


def test_init_then_lint(tmp_path: Path) -> None:
    assert slo("init", cwd=tmp_path).returncode == 0
    assert (tmp_path / "slo.yaml").read_text().startswith("# llm-slo spec")
    again = slo("init", cwd=tmp_path)
    assert again.returncode == 2 and "pass --force" in again.stderr
    lint = slo("lint", cwd=tmp_path)
    assert lint.returncode == 0
    assert "- p95 ttft <= 200ms" in lint.stdout and "window: 30d" in lint.stdout
