"""The report as a browser shows it: headless Chromium renders the charts and fetches nothing.

Chromium's NetLog records every URL request; the browser's own background traffic (update
checks, account probes) has no initiating origin, a page's requests do. A control page with
one external image proves the check would see a request if the report made one.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.helpers.binaries import binary
from tests.helpers.servers import free_port

pytest.importorskip("matplotlib")

from slo.cli.report.charts import percentile_figure, value_scale
from slo.cli.report.command import write_report
from slo.cli.report.figures import PALETTE
from slo.cli.report.industry_chart import industry_figure
from slo.records import iter_jsonl_dicts
from slo.spec import SLOSpec
from slo.store.columns import RecordColumns
from tests.e2e.screenshots import keep

EXAMPLE = Path(__file__).resolve().parents[2] / "slo" / "examples" / "run.jsonl"
WIDTH, HEIGHT = 1280, 4400


def render(page: Path, tmp_path: Path) -> tuple[Path, list[str]]:
    """Screenshot `page`; return the PNG and the URLs the page itself requested."""
    shot, netlog = tmp_path / f"{page.stem}.png", tmp_path / f"{page.stem}.netlog.json"
    command = [
        binary("chromium", "chromium-browser", "google-chrome"), "--headless", "--no-sandbox",
        "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
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
    keep(shot.read_bytes(), "report.png", max_width=900, max_height=2300)
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


def test_the_industry_chart_fits_its_axes_to_the_data() -> None:
    """A p95 TTFT of 12 ms and a p95 TPOT of 1.5 ms sit inside the axes, and so does a slow
    tier far beyond the boxes, while every box edge stays in view."""
    fast = SimpleNamespace(
        name="fast", performance=SimpleNamespace(ttft_p95_s=0.012, tpot_p95_s=0.0015)
    )
    slow = SimpleNamespace(name="slow", performance=SimpleNamespace(ttft_p95_s=9.0, tpot_p95_s=0.4))
    figure = industry_figure(SimpleNamespace(tiers=[fast, slow]), {})  # type: ignore[arg-type]
    (axes,) = figure.axes
    (x_low, x_high), (y_low, y_high) = axes.get_xlim(), axes.get_ylim()
    assert x_low < 12 and x_high > 9000 and y_low < 1.5 and y_high > 400
    assert x_high > 2000 and y_high > 100  # the Basic box's edges (2 s, 100 ms)


def test_percentile_bars_stay_readable_beside_a_far_threshold() -> None:
    spec = SLOSpec.from_yaml("""
version: 1
tiers:
  - name: premium
    default: true
    objectives: [p95 ttft <= 10s]
""")
    rows = [{"request_id": f"r{i}", "timestamp": 1.0 + i, "tier": "premium", "outcome": "ok",
             "ttft_s": 0.012 + 0.001 * (i % 10), "e2e_s": 0.2, "tpot_s": 0.01,
             "output_tokens": 10} for i in range(100)]  # fmt: skip
    ttft_axes = percentile_figure(spec, RecordColumns.from_dicts(rows)).axes[0]
    assert ttft_axes.get_yscale() == "log"
    low, high = ttft_axes.get_ylim()
    assert low < 12 and high > 10_000  # the smallest bar and the 10 s line on one axis
    # A tenfold spread or less stays linear from zero; more goes logarithmic.
    assert value_scale([20.0, 25.0], [200.0]) == ("linear", (0.0, 200.0 * 1.15))
    assert value_scale([20.0, 25.0], [201.0])[0] == "log"
    assert value_scale([], []) == ("linear", (0.0, 1.0))
