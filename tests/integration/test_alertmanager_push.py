"""The in-process evaluator pushes what fires to a real HTTP receiver speaking Alertmanager's v2
API."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from middleware.clock import ScriptedClock
from middleware.live import LiveSLO
from slo.spec import SLOSpec
from tests.helpers.live_traffic import SPEC, feed
from tests.helpers.polling import wait_until

pytestmark = pytest.mark.integration


def test_firing_alerts_are_pushed_to_alertmanager_v2_api() -> None:
    received: list[list[dict[str, object]]] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers["content-length"])
            if self.path == "/api/v2/alerts":
                received.append(json.loads(self.rfile.read(length)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    clock = ScriptedClock()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    live = LiveSLO(
        SLOSpec.from_yaml(SPEC), clock=clock, alertmanager_url=url, evaluation_interval_s=0.05
    )
    try:
        feed(live, clock, "premium", 100, 0.9)
        wait_until(lambda: bool(received), 10.0, "an alert at /api/v2/alerts")
    finally:
        live.close()
        server.shutdown()
        server.server_close()
    alerts = received[0]
    names = {a["labels"]["alertname"] for a in alerts}  # type: ignore[index]
    assert "LLMSLOTTFTBudgetBurn" in names
    assert all(a["endsAt"] > a["startsAt"] for a in alerts)  # type: ignore[operator]
