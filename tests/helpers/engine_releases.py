"""The engines' released versions the tests run or read, in one place.

`.ci/run` installs each wheel named here without its dependencies (`pip install --no-deps`),
and the contract tests (tests/unit/middleware/upstream/test_sglang_release.py) check that the
installed one is this version before they read it.
"""

from __future__ import annotations

# SGLang's wheel from PyPI: its observability package (tracing, request stages, /metrics) is
# Python and runs on a CPU (tests/helpers/sglang_release.py loads it).
SGLANG_VERSION = "0.5.23"

# `pip install --no-deps` requirements, one per wheel (printed by `python -m
# tests.helpers.engine_releases` for .ci/run).
NO_DEPS_WHEELS = (f"sglang=={SGLANG_VERSION}",)


if __name__ == "__main__":
    print(" ".join(NO_DEPS_WHEELS))
