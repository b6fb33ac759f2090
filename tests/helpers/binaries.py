"""One lookup of the programs the integration tests run (prometheus, promtool, alertmanager,
chromium, nginx): the path, or a skip that names the package (a failure in CI)."""

from __future__ import annotations

import shutil

from tests.conftest import require_or_skip

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
