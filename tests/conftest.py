"""Shared test helpers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from hypothesis import settings

from slo.store import RecordStore
from tests.helpers import skip_guard
from tests.helpers.checkpoints import llama_checkpoints  # noqa: F401  (a session fixture)
from tests.helpers.tls import Pki, make_pki

# No timing asserts in tests: hypothesis' per-example deadline is one (a shared 2-core machine
# under load ran a 20 ms example in 272 ms, and the property failed as "flaky").
settings.register_profile("llm-slo", deadline=None)
settings.load_profile("llm-slo")


def pytest_configure(config: pytest.Config) -> None:
    # CI (.ci/run) sets LLM_SLO_ALLOWED_SKIPS: every skip is printed, an unlisted one fails.
    skip_guard.register(config)


def require_or_skip(reason: str) -> NoReturn:
    """Skip a test that lacks something it needs; in CI (LLM_SLO_REQUIRE_INTEGRATION=1) fail."""
    if os.environ.get("LLM_SLO_REQUIRE_INTEGRATION") == "1":
        pytest.fail(f"required for integration tests but missing: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RecordStore]:
    """A real SQLite record store in the test's folder, closed afterwards."""
    record_store = RecordStore(f"sqlite:///{tmp_path / 'records.db'}")
    yield record_store
    record_store.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA with a server certificate (localhost, 127.0.0.1) and a client certificate, made
    once per module (tests/helpers/tls.py)."""
    return make_pki(tmp_path_factory.mktemp("pki"))
