"""One lookup of the programs the integration tests run (prometheus, promtool, alertmanager,
chromium, nginx, llama-server): the path, or a skip that names the package (a failure in CI)."""

from __future__ import annotations

import os
import shutil

from tests.conftest import require_or_skip
from tests.helpers.build_llama_server import cached_binaries

PACKAGES = {
    "prometheus": "prometheus",
    "promtool": "prometheus",
    "alertmanager": "prometheus-alertmanager",
    "prometheus-alertmanager": "prometheus-alertmanager",
    "chromium": "chromium",
    "chromium-browser": "chromium",
    "google-chrome": "chromium",
    "nginx": "nginx",
}
# Debian puts nginx in /usr/sbin, which is not on every user's PATH.
EXTRA_PATH = "/usr/sbin:/usr/local/sbin"


def binary(*names: str) -> str:
    """The first of `names` found; skips (fails under LLM_SLO_REQUIRE_INTEGRATION) if none."""
    for name in names:
        if path := shutil.which(name) or shutil.which(name, path=EXTRA_PATH):
            return path
    packages = sorted({PACKAGES.get(name, name) for name in names})
    require_or_skip(f"{' or '.join(names)} not installed (Debian: {', '.join(packages)})")


def llama_server() -> str:
    """llama.cpp's C++ server: $LLM_SLO_LLAMA_SERVER, else on PATH, else the one
    tests/helpers/build_llama_server.py cached; skips (fails in CI) if none."""
    if explicit := os.environ.get("LLM_SLO_LLAMA_SERVER"):
        if not os.access(explicit, os.X_OK):
            require_or_skip(f"LLM_SLO_LLAMA_SERVER={explicit} is not an executable file")
        return explicit
    if path := shutil.which("llama-server"):
        return path
    if cached := cached_binaries():
        return str(cached[0])
    require_or_skip(
        "llama-server not found (no Debian package in bookworm): build it with "
        "python tests/helpers/build_llama_server.py, or set LLM_SLO_LLAMA_SERVER"
    )
