"""Shared test helpers."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def require_or_skip(reason: str) -> NoReturn:
    """Skip a test that lacks something it needs; in CI (LLM_SLO_REQUIRE_INTEGRATION=1) fail."""
    if os.environ.get("LLM_SLO_REQUIRE_INTEGRATION") == "1":
        pytest.fail(f"required for integration tests but missing: {reason}", pytrace=False)
    pytest.skip(reason)
