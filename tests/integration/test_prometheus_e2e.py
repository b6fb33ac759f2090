"""End to end with real processes on 127.0.0.1: `slo serve` replicas with the middleware, a
Prometheus scraping them with the generated rules, an Alertmanager with the generated config
and a webhook receiver here. Under load every dashboard query returns data and two replicas
add up; once a replica is slowed down, the TTFT burn-rate alert reaches the webhook.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

pytest.importorskip("torch")

from prometheus_client.parser import text_string_to_metric_families

from alerts import Links, Timing, write_alerts
from alerts.alertmanager import receiver_name
from dashboards import panel_queries, render_dashboard, substitute
from slo.sli import CATALOG
from slo.spec import SLOSpec
from tests.helpers.fleet_stack import alertmanager
from tests.helpers.polling import wait_until
from tests.helpers.prometheus_process import prometheus as prometheus_process
from tests.helpers.prometheus_process import query
from tests.helpers.servers import json_receiver, slo_serve
from tests.helpers.tier_specs import burn_alert, burn_policy, make_tier, spec_yaml, threshold_alert

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(480)]

# Short windows so the whole drill fits in a few minutes; 250 ms TTFT is easy for the tiny
# model and impossible once every engine step sleeps 300 ms.
SPEC = spec_yaml(
    make_tier("premium", "p95 ttft <= 250ms", "availability >= 99%"),
    make_tier("standard", "p95 ttft <= 5s", default=True),
    window="10m",
    alert_policy=burn_policy(
        burn_alert("page", "1m", "20s", 2), min_events=5, thresholds=[threshold_alert(95, 2)]
    ),
)
SLOW_STEP_MS = "300"
RATE_INTERVAL = "15s"  # Grafana's $__rate_interval for a 1s scrape interval, with margin
ALERT = "LLMSLOTTFTBudgetBurn"


class Load:
    """A few client threads sending small completions until stopped."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=4)

    def run(self, base_url: str, tier: str, threads: int = 2) -> None:
        for _ in range(threads):
            self.pool.submit(self._loop, base_url, tier)

    def _loop(self, base_url: str, tier: str) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    client.post(
                        f"{base_url}/v1/completions",
                        headers={"x-llm-tier": tier},
                        json={"model": "bundled:tiny", "prompt": "Hello there", "max_tokens": 6},
                    )

    def halt(self) -> None:
        self.stop.set()
        self.pool.shutdown(wait=True)
        self.stop.clear()
        self.pool = ThreadPoolExecutor(max_workers=4)


def _requests_total(base_url: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    name = CATALOG["requests"].metric
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


def test_generated_stack_end_to_end(tmp_path: Path) -> None:
    spec_path = tmp_path / "slo.yaml"
    spec_path.write_text(SPEC)
    spec = SLOSpec.load(spec_path)
    load = Load()

    with (
        json_receiver("/alerts") as (webhook_url, received),
        slo_serve(
            "--spec", str(spec_path), "--store", f"sqlite:///{tmp_path / 'a.db'}"
        ) as replica_a,
        slo_serve(
            "--spec", str(spec_path), "--store", f"sqlite:///{tmp_path / 'b.db'}"
        ) as replica_b,
        # Scraped from the start, idle until the drill: every engine step sleeps 300 ms. Under
        # priority scheduling: the drill wants slow first tokens served, which the default
        # (slo, from the spec's TTFT objective) would shed as out of reach instead.
        slo_serve(
            "--spec",
            str(spec_path),
            "--store",
            f"sqlite:///{tmp_path / 'c.db'}",
            "--step-delay-ms",
            SLOW_STEP_MS,
            "--scheduling",
            "priority",
        ) as slow,  # fmt: skip
    ):
        timing = Timing("1s", "1s", "1m", "1m", "1m")
        write_alerts(spec, tmp_path, Links(), webhook_url, timing, slow_interval=None)
        targets = [url.removeprefix("http://") for url in (replica_a, replica_b, slow)]
        with (
            alertmanager(tmp_path, tmp_path / "alertmanager/alertmanager.yml") as am_address,
            prometheus_process(
                tmp_path, targets, [str(tmp_path / "prometheus/rules.yml")], am_address
            ) as prometheus,
        ):
            # Healthy traffic on both replicas, both tiers.
            for replica in (replica_a, replica_b):
                load.run(replica, "premium", threads=1)
                load.run(replica, "standard", threads=1)
            queries = [q for q in panel_queries(render_dashboard(spec)) if not q.optional]

            def every_panel_has_data() -> bool:
                return all(query(prometheus, substitute(q.expr, RATE_INTERVAL)) for q in queries)

            wait_until(every_panel_has_data, 120, "data in every dashboard panel", interval_s=1.0)
            load.halt()

            # Two replicas add up: Prometheus' total equals the sum of both /metrics.
            expected = _requests_total(replica_a) + _requests_total(replica_b)
            requests = CATALOG["requests"].metric

            def totals_match() -> bool:
                result = query(prometheus, f"sum({requests})")
                return bool(result) and float(result[0]["value"][1]) == expected

            wait_until(totals_match, 30, f"sum({requests}) == {expected}", interval_s=1.0)
            instances = query(prometheus, f"count(sum by (instance) ({requests}) > 0)")
            assert float(instances[0]["value"][1]) == 2  # the idle slow replica has no requests
            p95 = next(q for q in queries if q.panel.startswith("TTFT") and "0.95" in q.expr)
            series = query(prometheus, substitute(p95.expr, RATE_INTERVAL))
            assert sorted(s["metric"]["tier"] for s in series) == ["premium", "standard"]
            assert all(set(s["metric"]) == {"tier"} for s in series)  # aggregated over replicas
            assert not query(prometheus, f'ALERTS{{alertname="{ALERT}"}}')
            # The in-process evaluator agrees: nothing fires on healthy traffic.
            assert httpx.get(replica_a + "/slo").json()["alerts"] == []

            # The slowed replica takes all premium traffic: the budget burns, the page goes out.
            load.run(slow, "premium", threads=4)
            try:
                firing = f'ALERTS{{alertname="{ALERT}", alertstate="firing", tier="premium"}}'
                wait_until(
                    lambda: bool(query(prometheus, firing)), 150, f"{ALERT} firing", interval_s=1.0
                )

                def delivered() -> bool:
                    return any(
                        alert["labels"].get("alertname") == ALERT and alert["status"] == "firing"
                        for payload in received
                        for alert in payload["alerts"]
                    )

                wait_until(delivered, 60, f"{ALERT} at the webhook", interval_s=1.0)

                # The slowed replica's in-process evaluator (same rules, same buckets) fires
                # the same alerts as Prometheus for the tier it serves alone.
                def same_alerts() -> bool:
                    local = {
                        (a["alertname"], a["labels"]["tier"])
                        for a in httpx.get(slow + "/slo").json()["alerts"]
                    }
                    remote = {
                        (r["metric"]["alertname"], r["metric"].get("tier"))
                        for r in query(prometheus, 'ALERTS{alertstate="firing", tier="premium"}')
                    }
                    return (ALERT, "premium") in local and local == remote

                wait_until(
                    same_alerts,
                    60,
                    "the same premium alerts in Prometheus and in /slo",
                    interval_s=1.0,
                )
            finally:
                load.halt()
    payload = next(
        p for p in received if any(a["labels"]["alertname"] == ALERT for a in p["alerts"])
    )
    assert payload["receiver"] == receiver_name("critical", "premium")
    alert = next(a for a in payload["alerts"] if a["labels"]["alertname"] == ALERT)
    assert alert["labels"]["severity"] == "critical"
    assert alert["labels"]["objective"] == "p95 ttft <= 250ms"
    assert alert["annotations"]["runbook_url"].endswith(f"/{ALERT}.md")
