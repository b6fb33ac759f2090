"""`slo bench`, `slo report` and `slo demo` at the front door: arguments, errors, light imports."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slo.cli import main
from tests.helpers.servers import free_port


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--url", "http://x", "--requests", "0"], "--requests must be >= 1"),
        (["--url", "http://x", "--rate", "0"], "--rate must be > 0"),
        (["--url", "http://x", "--concurrency", "0"], "--concurrency must be >= 1"),
        (["--url", "http://x", "--duration-limit", "-1"], "--duration-limit must be > 0"),
    ],
)
def test_bad_numbers_are_one_line_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        [],  # neither --url nor --embedded
        ["--url", "http://x", "--embedded"],
        ["--url", "http://x", "--rate", "1", "--concurrency", "2"],
        ["--url", "http://x", "--profile", "chatty"],
    ],
)
def test_conflicting_or_missing_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *argv])
    assert exit_info.value.code == 2


def test_an_unreachable_server_is_named(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["bench", "--url", url, "--out", str(tmp_path / "r.jsonl")]) == 2
    error = capsys.readouterr().err
    assert url in error and "/v1/models" in error


def test_the_new_commands_import_nothing_heavy() -> None:
    # matplotlib only when a report is drawn; middleware and generators never from slo/, and
    # of the engine only its policies (--scheduling's choices, tests/unit/house/test_imports.py).
    code = (
        "import sys, importlib\n"
        "for m in ('slo.cli.bench', 'slo.cli.bench.command', 'slo.cli.bench.server', "
        "'slo.cli.report.command', 'slo.cli.demo.command'):\n"
        "    importlib.import_module(m)\n"
        "from slo.cli import build_parser; build_parser()\n"
        "heavy = ('torch', 'engine', 'middleware', 'alerts', 'dashboards', 'matplotlib')\n"
        "def loaded():\n"
        "    return sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in heavy\n"
        "                   and m != 'engine' and not m.startswith('engine.policies')})\n"
        "print(loaded())\n"
        "import slo.cli.report.charts\n"
        "print(loaded())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["[]", "['matplotlib']"]
