"""Every label child exists at 0 from startup, in one process and in multiprocess mode, so
Prometheus' `increase()` counts a series' first requests (issue: 8 of 80 requests seen)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from middleware import LatencyMiddleware
from middleware.config import MiddlewareConfig
from middleware.metrics.metric_set import PER_REQUEST
from slo.sli import CATALOG, OUTCOMES
from tests.helpers.tier_specs import make_tier, spec_yaml

SPEC = spec_yaml(
    make_tier("premium", "p95 ttft <= 250ms"),
    make_tier("batch", "p95 e2e <= 30s", match={"routes": ["/v1/embeddings"]}),
    make_tier("standard", "availability >= 99%", default=True),
)
TIERS = ("premium", "batch", "standard")
# The middleware's default LLM routes plus the route a tier matches on.
ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings")
HISTOGRAMS = (*PER_REQUEST, "itl")


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _expected_zeros() -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    """Every sample that must be 0 before the first request: one per child (counts, not
    buckets: a bucket sample is there exactly when its `_count` is)."""
    keys = []
    for tier in TIERS:
        for route in ROUTES:
            labels = {"tier": tier, "route": route, "model": "m"}
            for outcome in OUTCOMES:
                with_outcome = tuple(sorted({**labels, "outcome": outcome}.items()))
                keys.append((CATALOG["requests"].metric, with_outcome))
            keys.append((CATALOG["throughput"].metric, tuple(sorted(labels.items()))))
            keys.append((CATALOG["good_requests"].metric, tuple(sorted(labels.items()))))
            for name in HISTOGRAMS:
                keys.append((CATALOG[name].metric + "_count", tuple(sorted(labels.items()))))
                inf = tuple(sorted({**labels, "le": "+Inf"}.items()))
                keys.append((CATALOG[name].metric + "_bucket", inf))
    return keys


def _assert_all_zero(text: str) -> None:
    samples = _samples(text)
    missing = [key for key in _expected_zeros() if key not in samples]
    assert not missing, f"{len(missing)} children missing, e.g. {missing[:3]}"
    nonzero = {key: samples[key] for key in _expected_zeros() if samples[key] != 0}
    assert not nonzero


async def _complete(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = json.dumps({"choices": [{"text": "hi"}]}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _call(app: Any, path: str, headers: dict[str, str] | None = None) -> bytes:
    scope = {
        "type": "http",
        "method": "POST" if path.startswith("/v1/") else "GET",
        "path": path,
        "headers": [(k.encode(), v.encode()) for k, v in (headers or {}).items()],
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def _middleware(tmp_path: Path) -> LatencyMiddleware:
    spec_path = tmp_path / "slo.yaml"
    spec_path.write_text(SPEC)
    return LatencyMiddleware(
        _complete,
        spec=spec_path,
        store=None,
        model="m",
        config=MiddlewareConfig.of(registry=CollectorRegistry()),
    )


def test_every_child_is_exported_at_zero_before_any_request(tmp_path: Path) -> None:
    middleware = _middleware(tmp_path)
    try:
        _assert_all_zero(asyncio.run(_call(middleware, "/metrics")).decode())
        # The same children then count requests (the zeros are the series, not a copy).
        asyncio.run(_call(middleware, "/v1/completions", {"x-llm-tier": "premium"}))
        after = _samples(asyncio.run(_call(middleware, "/metrics")).decode())
        labels = {"tier": "premium", "route": "/v1/completions", "model": "m", "outcome": "ok"}
        assert after[(CATALOG["requests"].metric, tuple(sorted(labels.items())))] == 1
    finally:
        middleware.close()
    # A restart (a new middleware, a new registry) exports every child at 0 again.
    restarted = _middleware(tmp_path)
    try:
        _assert_all_zero(asyncio.run(_call(restarted, "/metrics")).decode())
    finally:
        restarted.close()


def test_every_child_is_exported_at_zero_in_multiprocess_mode(tmp_path: Path) -> None:
    """prometheus_client picks its multiprocess values at import: each worker is a process."""
    spec_path = tmp_path / "slo.yaml"
    spec_path.write_text(SPEC)
    worker = textwrap.dedent(f"""
        import sys
        from middleware import LatencyMiddleware
        from tests.helpers.measured import settled_request
        middleware = LatencyMiddleware(None, spec={str(spec_path)!r}, store=None, model="m")
        for _ in range(int(sys.argv[1])):
            middleware.metrics.observe(settled_request("premium", "/v1/completions"), None, None)
        sys.stdout.write(middleware.metrics.exposition("")[0].decode())
        middleware.close()
    """)
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}

    def run(requests: int) -> str:
        return subprocess.run(
            [sys.executable, "-c", worker, str(requests)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout

    _assert_all_zero(run(0))
    assert list(metrics_dir.glob("counter_*.db"))  # read back from the worker's file
    # A second worker that counted requests: the aggregate sums both workers' files.
    samples = _samples(run(3))
    labels = {"tier": "premium", "route": "/v1/completions", "model": "m", "outcome": "ok"}
    assert samples[(CATALOG["requests"].metric, tuple(sorted(labels.items())))] == 3
    # A restarted server with a fresh directory (as prometheus_client asks) starts at 0.
    shutil.rmtree(metrics_dir)
    metrics_dir.mkdir()
    _assert_all_zero(run(0))
