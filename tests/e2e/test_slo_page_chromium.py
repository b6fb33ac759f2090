"""The on-call page as a person sees it: `slo serve` with a slowed engine, real traffic, and
headless Chromium driven over its DevTools protocol (console errors and every request the
page makes are events there, nothing is guessed from logs).

Healthy: short requests on both tiers, nothing firing. Burning: a burst of long premium
requests on an engine slowed to 200 ms a step (`--step-delay-ms`) puts their e2e far above
premium's 2 s, so the 5m/1m burn-rate alert fires. The page must show it without a reload (its
own refresh from `/slo?view=page`), with premium, listed second in the spec, first. A
screenshot per state is taken; `LLM_SLO_UPDATE_SCREENSHOTS=1` writes them to docs/screenshots/
for the README.
"""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.screenshots import keep
from tests.helpers.binaries import binary
from tests.helpers.servers import slo_serve
from tests.helpers.tier_specs import burn_alert, burn_policy, header_match, make_tier, spec_yaml

pytest.importorskip("torch")
websockets_sync = pytest.importorskip("websockets.sync.client")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SPEC = spec_yaml(
    make_tier(
        "standard",
        "p90 e2e <= 20s",
        "availability >= 90%",
        priority=1,
        default=True,
        match=header_match("standard"),
    ),
    make_tier("premium", "p90 ttft <= 2s", "p90 e2e <= 2s", "availability >= 90%", priority=0),
    min_events=5,
    alert_policy=burn_policy(
        burn_alert("page", "5m", "1m", 2), burn_alert("ticket", "1h", "5m", 1), thresholds=()
    ),
)
LAPTOP, PHONE = (1280, 900), (390, 844)


class DevTools:
    """One page over the DevTools protocol; events are kept as they arrive, in order."""

    def __init__(self, socket: Any) -> None:
        self.socket = socket
        self.events: list[dict[str, Any]] = []
        self._ids = iter(range(1, 1_000_000))

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self._ids)
        self.socket.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=30))
            if message.get("id") == ident:
                assert "error" not in message, (method, message["error"])
                return dict(message.get("result", {}))
            self.events.append(message)

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if value := self.evaluate(expression):
                return value
            time.sleep(0.2)
        raise AssertionError(f"not true after {timeout_s} s: {expression}")

    def named(self, method: str) -> list[dict[str, Any]]:
        return [event["params"] for event in self.events if event.get("method") == method]

    def screenshot(self, size: tuple[int, int], mobile: bool = False) -> bytes:
        """The whole page at this viewport width (the height grows to fit it)."""
        width, height = size
        self.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=mobile,
        )
        full = int(self.evaluate("document.documentElement.scrollHeight"))
        self.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=max(height, full),
            deviceScaleFactor=1,
            mobile=mobile,
        )
        data = self.send("Page.captureScreenshot", format="png")["data"]
        return base64.b64decode(data)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Callable[[], DevTools]]:
    profile = tmp_path / "profile"
    command = [
        binary("chromium", "chromium-browser", "google-chrome"),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        "about:blank",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sockets = contextlib.ExitStack()

    def page() -> DevTools:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.is_file() or not port_file.read_text().strip():
            assert time.monotonic() < deadline and process.poll() is None, "Chromium did not start"
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        target = next(t for t in targets if t["type"] == "page")
        url = target["webSocketDebuggerUrl"]
        return DevTools(sockets.enter_context(websockets_sync.connect(url, max_size=2**26)))

    try:
        yield page
    finally:
        sockets.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def complete(base_url: str, tier: str, max_tokens: int) -> int:
    body = {
        "model": "bundled:tiny",
        "prompt": "Hello there",
        "max_tokens": max_tokens,
        "stream": True,
    }
    with (
        httpx.Client(timeout=120) as client,
        client.stream(
            "POST", f"{base_url}/v1/completions", json=body, headers={"x-llm-tier": tier}
        ) as answer,
    ):
        answer.read()
        return answer.status_code


def traffic(base_url: str, requests: list[tuple[str, int]], parallel: int) -> None:
    with ThreadPoolExecutor(parallel) as pool:
        statuses = list(pool.map(lambda r: complete(base_url, *r), requests))
    assert statuses == [200] * len(requests)


def test_the_on_call_page_healthy_then_burning(
    browser: Callable[[], DevTools], tmp_path: Path
) -> None:
    spec = tmp_path / "slo.yaml"
    spec.write_text(SPEC)
    store = f"sqlite:///{tmp_path / 'records.db'}"
    with slo_serve("--spec", str(spec), "--store", store, "--step-delay-ms", "200") as base_url:
        traffic(base_url, [("premium", 2)] * 8 + [("standard", 2)] * 6, parallel=4)

        page = browser()
        for domain in ("Page", "Runtime", "Log", "Network"):
            page.send(f"{domain}.enable")
        page.send(
            "Emulation.setDeviceMetricsOverride",
            width=LAPTOP[0],
            height=LAPTOP[1],
            deviceScaleFactor=1,
            mobile=False,
        )
        page.send("Page.navigate", url=f"{base_url}/slo.html?range=1m")
        page.wait_for("document.querySelectorAll('#tiers section').length === 2", 20)
        assert page.evaluate("document.querySelector('#alerts li').className") == "none"
        states = page.evaluate(
            "[...document.querySelectorAll('#overview tr')].map(r => r.dataset.state)"
        )
        assert states and set(states) == {"met"}, states
        assert page.evaluate("document.querySelector('.phasebar i') !== null")  # phases drawn
        assert page.evaluate("document.querySelector('#engine b') !== null")  # engine reported
        keep(page.screenshot(LAPTOP), "slo-page-healthy.png")
        first_refresh = float(page.evaluate("document.body.dataset.evaluatedAt"))

        # The overload: long replies on the slowed engine, premium only.
        traffic(base_url, [("premium", 24)] * 12, parallel=12)
        burst_done = time.time()
        # The page's own refresh (every 5 s) brings the whole burst in: no reload asked for.
        page.wait_for(f"+document.body.dataset.evaluatedAt > {burst_done}", 15)
        assert float(page.evaluate("document.body.dataset.evaluatedAt")) > first_refresh
        assert len(page.named("Page.loadEventFired")) == 1  # refreshed in place, never reloaded

        alerts = page.evaluate(
            "[...document.querySelectorAll('#alerts li')]"
            ".map(li => [li.dataset.alert, li.dataset.tier, li.textContent])"
        )
        assert ["LLMSLOE2EBudgetBurn", "premium"] in [a[:2] for a in alerts], alerts
        assert all("runbooks/LLMSLOE2EBudgetBurn.md" in a[2] for a in alerts if "E2E" in a[0])
        assert page.evaluate("document.querySelector('#tiers section').dataset.tier") == "premium"
        first_row = page.evaluate(
            "[document.querySelector('#overview tr').dataset.tier, "
            "document.querySelector('#overview tr').dataset.state, "
            "document.querySelector('#overview tr').textContent]"
        )
        assert first_row[:2] == ["premium", "firing"] and "p90 E2E" in first_row[2], first_row
        assert page.evaluate("document.querySelector('.burn td[data-state=firing]') !== null")
        requests = page.evaluate("document.querySelector('#tiers section h3').textContent")
        assert "20 requests" in requests, requests  # 8 healthy + 12 slow, all counted
        # The burst's requests waited for each other: premium's blame names premium.
        blame = page.evaluate("document.querySelector('#tiers section .blame').textContent")
        assert blame.startswith("who made it wait since start: ") and "premium" in blame, blame
        keep(page.screenshot(LAPTOP), "slo-page-burning.png")

        # A phone-sized window: nothing wider than the screen (tables scroll in their box).
        keep(page.screenshot(PHONE, mobile=True), "slo-page-phone.png")
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE[0]

    requested = [event["request"]["url"] for event in page.named("Network.requestWillBeSent")]
    assert any("/slo?view=page&range=1m" in url for url in requested), requested
    assert all(url.startswith(base_url + "/") for url in requested), requested
    errors = [e for e in page.named("Runtime.consoleAPICalled") if e["type"] in ("error", "assert")]
    errors += page.named("Runtime.exceptionThrown")
    errors += [e for e in page.named("Log.entryAdded") if e["entry"]["level"] == "error"]
    assert errors == []
