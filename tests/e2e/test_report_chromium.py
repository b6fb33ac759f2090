"""The report as a browser shows it: headless Chromium renders the charts and fetches nothing.

Chromium's NetLog records every URL request; the browser's own background traffic (update
checks, account probes) has no initiating origin, a page's requests do. A control page with
one external image proves the check would see a request if the report made one.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import require_or_skip
from tests.servers import free_port

pytest.importorskip("matplotlib")

from slo.records import iter_jsonl_dicts
from slo.report import write_report
from slo.report_charts import PALETTE
from slo.spec import SLOSpec

EXAMPLE = Path(__file__).resolve().parents[2] / "slo" / "examples" / "run.jsonl"
WIDTH, HEIGHT = 1280, 4400


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    require_or_skip("headless Chromium (Debian package `chromium`) is not installed")


def render(page: Path, tmp_path: Path) -> tuple[Path, list[str]]:
    """Screenshot `page`; return the PNG and the URLs the page itself requested."""
    shot, netlog = tmp_path / f"{page.stem}.png", tmp_path / f"{page.stem}.netlog.json"
    command = [
        chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
        f"--window-size={WIDTH},{HEIGHT}", f"--screenshot={shot}", f"--log-net-log={netlog}",
        page.as_uri(),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    return shot, page_requests(json.loads(netlog.read_text()))


def page_requests(log: dict[str, Any]) -> list[str]:
    kinds = {number: name for name, number in log["constants"]["logEventTypes"].items()}
    urls = []
    for event in log["events"]:
        params = event.get("params") or {}
        if (
            kinds.get(event["type"]) == "URL_REQUEST_START_JOB"
            and "url" in params
            and params.get("initiator") != "not an origin"  # the browser's own traffic
        ):
            urls.append(params["url"])
    return [url for url in urls if not url.startswith("file:")]


def test_the_report_renders_its_charts_and_requests_nothing(tmp_path: Path) -> None:
    from PIL import Image

    page = write_report(SLOSpec.default(), list(iter_jsonl_dicts(EXAMPLE)),
                        tmp_path / "report.html", "example")  # fmt: skip
    text = page.read_text()
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", text, re.IGNORECASE)

    shot, requested = render(page, tmp_path)
    assert requested == []
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    assert pixels.shape == (HEIGHT, WIDTH, 3)
    drawn = np.any(pixels != 255, axis=2)
    assert drawn.mean() > 0.05  # not a blank page
    # Each tier's colour (solid p99 bars, CDF lines) is on screen: the SVG charts were drawn.
    for color in PALETTE[:3]:
        rgb = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
        count = int(np.all(pixels == rgb, axis=2).sum())
        assert count > 500, (color, count)


def test_the_network_check_sees_a_page_that_does_fetch(tmp_path: Path) -> None:
    control = tmp_path / "control.html"
    url = f"http://127.0.0.1:{free_port()}/pixel.png"  # nothing listens: the attempt is enough
    control.write_text(f'<!DOCTYPE html><html><body><img src="{url}"></body></html>')
    _, requested = render(control, tmp_path)
    assert requested == [url]
