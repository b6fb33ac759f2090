"""One page per incident, on real processes: a Prometheus evaluating the generated rules and
an Alertmanager with the generated config. A tier's TTFT and e2e burn together (the same
tier, the same phase); the webhook receives one notification carrying both pages, not one
per alert, and nothing reaches the escalation receiver before its wait.

The metrics come from the real prometheus_client, named and bucketed from the catalog and
the spec, as the middleware exports them; every request is slow, so both objectives burn
from the first scrapes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from alerts import Links, Timing, write_alerts
from alerts.alertmanager import ESCALATION_RECEIVER, GROUP_BY, receiver_name
from slo.cli.bench.server import free_port
from slo.sli import CATALOG, buckets_for
from slo.spec import SLOSpec
from tests.helpers.fleet_stack import alertmanager
from tests.helpers.polling import wait_until
from tests.helpers.prometheus_process import prometheus
from tests.helpers.servers import json_receiver
from tests.helpers.tier_specs import burn_alert, burn_policy, make_tier, spec_yaml

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

POLICY = burn_policy(burn_alert("page", "1m", "20s", 2), min_events=5, thresholds=())
SPEC = SLOSpec.from_yaml(
    spec_yaml(
        make_tier("premium", "p95 ttft <= 250ms", "p99 e2e <= 1s", default=True),
        window="10m",
        alert_policy={**POLICY, "anomalies": {"enabled": False}},
    )
)
PAGES = {"LLMSLOTTFTBudgetBurn", "LLMSLOE2EBudgetBurn"}
LABELS = {"tier": "premium", "model": "m", "route": "/v1/completions"}


@contextmanager
def slow_replica() -> Iterator[str]:
    """A /metrics target whose every request has a 0.5 s TTFT and a 2 s e2e; yields host:port."""
    registry = CollectorRegistry()
    histograms = {
        sli: Histogram(
            CATALOG[sli].metric.removesuffix("_seconds"),
            "",
            list(LABELS),
            registry=registry,
            buckets=buckets_for(sli, SPEC),
            unit="seconds",
        ).labels(**LABELS)
        for sli in ("ttft", "e2e")
    }
    requests = Counter(
        CATALOG["requests"].metric.removesuffix("_total"),
        "",
        [*LABELS, "outcome"],
        registry=registry,
    ).labels(**LABELS, outcome="ok")
    port = free_port()
    server, thread = start_http_server(port, "127.0.0.1", registry)
    stop = threading.Event()

    def traffic() -> None:
        while not stop.wait(0.1):
            histograms["ttft"].observe(0.5)
            histograms["e2e"].observe(2.0)
            requests.inc()

    worker = threading.Thread(target=traffic, daemon=True)
    worker.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop.set()
        worker.join()
        server.shutdown()
        server.server_close()
        thread.join()


def _firing_pages(received: list[dict[str, Any]]) -> list[tuple[str, set[str]]]:
    return [
        (payload["receiver"], {a["labels"]["alertname"] for a in payload["alerts"]})
        for payload in received
        if payload["status"] == "firing"
    ]


def test_correlated_pages_arrive_as_one_notification(tmp_path: Path) -> None:
    # group_wait holds the group long enough for both pages of one evaluation to join it.
    timing = Timing("10s", "2m", "1h", "1h", "5m")
    with json_receiver("/alerts") as (webhook, received), slow_replica() as target:
        write_alerts(SPEC, tmp_path, Links(), webhook, timing, slow_interval=None)
        with (
            alertmanager(tmp_path, tmp_path / "alertmanager/alertmanager.yml") as am,
            prometheus(tmp_path, [target], [str(tmp_path / "prometheus/rules.yml")], am),
        ):
            wait_until(lambda: bool(_firing_pages(received)), 120, "a page at the webhook", 1.0)
            # Past another group_wait: a second notification would have arrived by now.
            time.sleep(15)
    pages = _firing_pages(received)
    assert pages == [(receiver_name("critical", "premium"), PAGES)], received
    payload = received[0]
    assert payload["groupLabels"] == {"tier": "premium", "phase": "unknown"}, GROUP_BY
    assert ESCALATION_RECEIVER not in {receiver for receiver, _ in pages}
    assert all(a["labels"]["urgency"] == "page" for a in payload["alerts"])
