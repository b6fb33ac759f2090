"""A pytest plugin for CI: every skip is printed, and a skip not on the allowed list fails the run.

`.ci/run` sets LLM_SLO_ALLOWED_SKIPS to a file of the tests that may skip there (the ones that
need a CUDA device). A test that skips anywhere else vanished from CI without a word: a missing
package, a fixture that found nothing to do, a guard written before the feature existed.

The file: one allowed skip a line, `<node-id pattern> | <text the reason must contain>`; the
pattern is an fnmatch glob on the node id (`tests/unit/engine/test_quantize.py::*cuda*`), parameters
included; `#` starts a comment. tests/conftest.py registers the plugin when the variable is set;
`python -m pytest -p tests.helpers.skip_guard` does too.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ENV = "LLM_SLO_ALLOWED_SKIPS"
PLUGIN_NAME = "llm-slo-skip-guard"


@dataclass(frozen=True)
class Allowed:
    pattern: str
    reason: str  # text the skip's reason must contain
    where: str  # file:line of the entry, for the messages


@dataclass(frozen=True)
class Skip:
    node_id: str
    reason: str


def read_allowed(path: Path) -> list[Allowed]:
    """The entries of an allowed-skips file; a malformed line is a usage error naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise pytest.UsageError(f"{ENV}={path}: cannot read it ({error.strerror})") from None
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        content = line.split("#", 1)[0].strip()
        if not content:
            continue
        pattern, bar, reason = (part.strip() for part in content.partition("|"))
        if not bar or not pattern or not reason:
            raise pytest.UsageError(
                f"{path}:{number}: expected '<node-id pattern> | <reason text>', got {line!r}"
            )
        entries.append(Allowed(pattern, reason, f"{path}:{number}"))
    return entries


def skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    """The reason pytest records for a skip (`longrepr` is (path, line, 'Skipped: why'))."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


@dataclass(eq=False)  # a plugin: pluggy keeps it in sets, by identity
class SkipGuard:
    allowed: list[Allowed]
    skips: list[Skip] = field(default_factory=list)

    def allows(self, skip: Skip) -> bool:
        return any(
            fnmatch.fnmatchcase(skip.node_id, entry.pattern) and entry.reason in skip.reason
            for entry in self.allowed
        )

    def unlisted(self) -> list[Skip]:
        return [skip for skip in self.skips if not self.allows(skip)]

    def _note(self, report: pytest.CollectReport | pytest.TestReport) -> None:
        # An xfail is reported as skipped too; it is a test that ran, not one that vanished.
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skips.append(Skip(report.nodeid, skip_reason(report)))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._note(report)  # a module-level importorskip skips the whole file here

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._note(report)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.unlisted() and session.exitstatus in (
            pytest.ExitCode.OK,
            pytest.ExitCode.NO_TESTS_COLLECTED,
        ):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        unlisted = self.unlisted()
        terminalreporter.section(f"skips ({ENV})")
        terminalreporter.line(
            f"{len(self.skips)} skipped, {len(unlisted)} not allowed by {ENV}"
            + ("" if unlisted else ": every skip is listed")
        )
        for skip in self.skips:
            mark = "ALLOWED  " if self.allows(skip) else "NOT ALLOWED"
            terminalreporter.line(f"{mark} {skip.node_id}: {skip.reason}")
        if unlisted:
            terminalreporter.line(
                f"the run fails: a test above skipped that {ENV} does not list; make it run "
                "here, or list it with the reason it may skip",
                red=True,
            )


def register(config: pytest.Config) -> None:
    """Register the guard when LLM_SLO_ALLOWED_SKIPS names a file (once per session)."""
    path = os.environ.get(ENV)
    if not path or config.pluginmanager.has_plugin(PLUGIN_NAME):
        return
    config.pluginmanager.register(SkipGuard(read_allowed(Path(path))), PLUGIN_NAME)


def pytest_configure(config: pytest.Config) -> None:
    register(config)
