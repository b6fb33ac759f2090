"""The SLO-headroom gauge is on the server's `/metrics`: in one process from the middleware's
own series, with several workers from their sum; and every series the generated autoscaling
manifests name is one `/metrics` exports."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from alerts.autoscaling import render_autoscaling
from middleware import LatencyMiddleware
from middleware.config import MiddlewareConfig
from middleware.metrics.metric_set import MetricSet
from middleware.types import Receive, Scope, Send
from slo.headroom import GAUGE, WINDOW_S
from slo.sli import CATALOG
from slo.spec import SLOSpec

SPEC = """
version: 1
tiers:
  - name: premium
    priority: 0
    match: {header: x-llm-tier, values: [premium]}
    objectives: ["p90 ttft <= 200ms"]
  - name: standard
    priority: 1
    default: true
    match: {header: x-llm-tier, values: [standard]}
    objectives: ["p95 ttft <= 1s"]
"""


def _ratios(text: str) -> dict[str, float]:
    return {
        sample.labels["tier"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == GAUGE
    }


def _queue(metrics: MetricSet, tier: str, waiting: float) -> None:
    metrics.gauges["queue_depth"].labels(tier=tier, model="m").set(waiting)


async def _get(app: Any, path: str) -> bytes:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "headers": [], "query_string": b""}
    await app(scope, receive, send)
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


async def _no_app(scope: Scope, receive: Receive, send: Send) -> None:
    raise AssertionError("only /metrics is asked")


def test_the_middlewares_metrics_endpoint_serves_the_gauge_per_tier(tmp_path: Path) -> None:
    spec_path = tmp_path / "slo.yaml"
    spec_path.write_text(SPEC)
    app = LatencyMiddleware(
        _no_app,
        spec=spec_path,
        store=None,
        model="m",
        config=MiddlewareConfig.of(registry=CollectorRegistry()),
    )
    try:
        assert _ratios(asyncio.run(_get(app, "/metrics")).decode()) == {
            "premium": 0.0,
            "standard": 0.0,
        }
        _queue(app.metrics, "premium", 3)
        # Nothing finished yet: the drain rate is its floor, one request per window.
        ratios = _ratios(asyncio.run(_get(app, "/metrics")).decode())
        assert ratios["premium"] == pytest.approx(3 * WINDOW_S / 0.2)
        assert ratios["standard"] == pytest.approx(3 * WINDOW_S / 1.0)  # premium goes first
    finally:
        app.close()


def test_with_several_workers_the_gauge_reads_every_workers_queue(tmp_path: Path) -> None:
    """prometheus_client picks its multiprocess values at import: each worker is a process.
    Two workers hold 2 and 4 premium requests waiting; the one serving /metrics reads 6."""
    spec = SLOSpec.from_yaml(SPEC)
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    worker = textwrap.dedent(f"""
        import sys
        from middleware.metrics.metric_set import MetricSet
        from slo.spec import SLOSpec
        metrics = MetricSet(SLOSpec.from_yaml({SPEC!r}), "m")
        metrics.gauges["queue_depth"].labels(tier="premium", model="m").set(int(sys.argv[1]))
        sys.stdout.write(metrics.exposition("")[0].decode())
    """)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}

    def run(waiting: int) -> str:
        command = [sys.executable, "-c", worker, str(waiting)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert _ratios(run(2))["premium"] == pytest.approx(2 * WINDOW_S / 0.2)
    ratios = _ratios(run(4))
    assert ratios["premium"] == pytest.approx(6 * WINDOW_S / 0.2)
    assert set(ratios) == {t.name for t in spec.tiers}


def test_the_manifests_name_only_series_the_server_exports() -> None:
    spec = SLOSpec.from_yaml(SPEC)
    registry = CollectorRegistry()
    MetricSet(spec, "m", registry, routes=("/v1/completions",))
    exported = {sample.name for family in registry.collect() for sample in family.samples}
    manifests = render_autoscaling(spec)
    assert manifests
    named = {name for text in manifests.values() for name in re.findall(r"\bllm_slo_[a-z_]+", text)}
    # The HPA's external metrics are the gauge's name with the tier (prometheus-adapter serves
    # them); everything else a query or a series selector reads must be on /metrics.
    external = {f"{GAUGE}_{tier.name}" for tier in spec.tiers}
    assert named & external == external
    assert named - external <= exported, named - external - exported
    assert GAUGE in exported and CATALOG["ttft_headroom"].metric == GAUGE
