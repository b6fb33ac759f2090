"""Live SLOs across workers: a server started with `uvicorn --workers 2` answers `/slo` from
any worker with every worker's requests, fires the same alerts in each, and one worker (the
holder of the pusher lock) pushes them to Alertmanager (a webhook here)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from middleware.live.shared import LIVE_DIR_NAME
from tests.helpers.servers import free_port, json_receiver, wait_until_ready
from tests.helpers.tier_specs import burn_alert, burn_policy, make_tier, spec_yaml

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SPEC = spec_yaml(
    make_tier("premium", "availability >= 99%"),
    make_tier("standard", "availability >= 99%", default=True),
    alert_policy=burn_policy(burn_alert("page", "1m", "20s", 2), min_events=5),
)
APP = """
import os
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from middleware import LatencyMiddleware
from middleware.live import LiveSLO

USAGE = {{"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}

async def complete(request):
    if request.headers.get("x-fail"):
        return JSONResponse({{"error": {{"message": "boom"}}}}, status_code=500)
    return JSONResponse({{"choices": [{{"text": "hi there"}}], "usage": USAGE}})

async def health(request):
    return JSONResponse({{"ok": True}})

inner = LatencyMiddleware(
    Starlette(
        routes=[Route("/v1/completions", complete, methods=["POST"]), Route("/health", health)]
    ),
    spec={spec!r}, store=None, model="m",
)
# Push every second (15 s by default) so the test sees a push soon.
inner.live.close()
inner.live = LiveSLO(inner.spec, alertmanager_url={alertmanager!r}, evaluation_interval_s=1.0)
WORKER = str(os.getpid()).encode()

async def app(scope, receive, send):
    async def send_with_worker(message):
        if message["type"] == "http.response.start":
            message = {{**message, "headers": [*message.get("headers", []), (b"x-worker", WORKER)]}}
        await send(message)
    await inner(scope, receive, send_with_worker if scope["type"] == "http" else send)
"""
# Enough requests on fresh connections that SO_REUSEPORT gives each worker some.
TRAFFIC = {"premium": 30, "standard": 30}
FAIL_EVERY = 5  # every 5th standard request is a 500: availability 80%, the budget burns


def _flock_holders(path: Path) -> set[int]:
    """Pids holding an flock on `path`, from Linux's /proc/locks lines:
    `1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF` (pid, then device:inode)."""
    inode = path.stat().st_ino
    holders = set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "FLOCK" in fields and fields[5].split(":")[-1] == str(inode):
            holders.add(int(fields[4]))
    return holders


def test_slo_from_any_worker_counts_every_workers_requests(tmp_path: Path) -> None:
    if not Path("/proc/locks").exists():
        pytest.skip("needs Linux /proc/locks to see which worker holds the pusher lock")
    spec_path = tmp_path / "slo.yaml"
    spec_path.write_text(SPEC)
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    port = free_port()
    with json_receiver() as (alertmanager, pushes):
        (tmp_path / "workers_app.py").write_text(
            textwrap.dedent(APP).format(spec=str(spec_path), alertmanager=alertmanager)
        )
        env = {
            **os.environ,
            "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
            "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.getcwd()}",
        }
        command = [sys.executable, "-m", "uvicorn", "workers_app:app", "--workers", "2"]
        command += ["--port", str(port), "--log-level", "warning"]
        process = subprocess.Popen(command, env=env, cwd=tmp_path)
        try:
            base_url = f"http://127.0.0.1:{port}"
            wait_until_ready(base_url + "/health", process=process)
            served: Counter[str] = Counter()
            sent: Counter[str] = Counter()
            for index in range(max(TRAFFIC.values())):
                for tier, count in TRAFFIC.items():
                    if index >= count:
                        continue
                    fail = tier == "standard" and index % FAIL_EVERY == 0
                    headers = {"x-llm-tier": tier, "connection": "close"}
                    response = httpx.post(
                        base_url + "/v1/completions",
                        headers={**headers, **({"x-fail": "1"} if fail else {})},
                    )
                    assert response.status_code == (500 if fail else 200)
                    served[response.headers["x-worker"]] += 1
                    sent[tier] += 1
            assert len(served) == 2, f"one worker took every request: {served}"

            # /slo from each worker (asked until both answered): every worker's requests.
            answers: dict[str, dict[str, Any]] = {}
            for _ in range(200):
                response = httpx.get(base_url + "/slo", headers={"connection": "close"})
                answers[response.headers["x-worker"]] = response.json()
                if len(answers) == 2:
                    break
            assert set(answers) == set(served)
            for status in answers.values():
                requests = {tier["tier"]: tier["requests"] for tier in status["tiers"]}
                assert requests == dict(sent)
                events = {
                    (tier["tier"], objective["objective"]): objective["events"]
                    for tier in status["tiers"]
                    for objective in tier["objectives"]
                }
                assert events == {(tier, "availability >= 99%"): sent[tier] for tier in sent}
            alerts = [
                sorted((a["alertname"], a["labels"]["tier"]) for a in status["alerts"])
                for status in answers.values()
            ]
            assert alerts[0] == alerts[1] and {tier for _, tier in alerts[0]} == {"standard"}

            # One worker pushes those alerts: the one holding the pusher lock.
            deadline = time.monotonic() + 60
            while not pushes and time.monotonic() < deadline:
                time.sleep(0.1)
            assert pushes, "no alerts pushed"
            pushed = {(a["labels"]["alertname"], a["labels"]["tier"]) for a in pushes[0]}
            assert pushed == set(alerts[0])
            lock = metrics_dir / LIVE_DIR_NAME / "alert-pusher.lock"
            holders = _flock_holders(lock)
            assert len(holders) == 1 and {str(pid) for pid in holders} <= set(served)
        finally:
            process.terminate()
            process.wait(timeout=30)
