"""The SLO core must stay light: importing it never pulls in torch (checked in a fresh process)."""

from __future__ import annotations

import subprocess
import sys

CORE = (
    "slo", "slo.sli", "slo.spec", "slo.records", "slo.store", "slo.evaluate", "slo.columns",
    "slo.cli.check", "slo.cli.lint", "slo.openslo", "slo.cli.report.formats", "slo.cli.prometheus_source",
    "slo.performance", "slo.cli",
)  # fmt: skip


def test_core_imports_do_not_load_torch() -> None:
    # One fresh process imports each module in turn and reports the first that pulled in
    # something heavy: torch in sys.modules after any of them would show here.
    code = (
        "import sys, importlib\n"
        f"for module in {CORE!r}:\n"
        "    importlib.import_module(module)\n"
        "    heavy = [m for m in ('torch', 'engine', 'middleware', 'transformers') if m in sys.modules]\n"
        "    if heavy:\n"
        "        print(module, 'imported', ','.join(heavy)); break\n"
        "else:\n"
        "    print('clean')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "clean"


def test_the_check_parser_builds_without_heavy_imports() -> None:
    code = (
        "import sys; from slo.cli import build_parser; build_parser(); "
        "print('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "False", result.stderr
