"""The `gen_ai_*` series of a multi-worker server add up on /metrics, as the `llm_slo_*` ones do:
three worker processes (PROMETHEUS_MULTIPROC_DIR set, as a multi-worker server sets it) each
serve the same requests; the last one's /metrics counts all of them. Without
OTEL_METRICS_EXPORTER (or spans on) there are no gen_ai series: OpenTelemetry off costs nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.genai_traffic import REQUESTS

ROOT = Path(__file__).resolve().parents[2]
WORKER = """
import asyncio, sys
from middleware import LatencyMiddleware, MiddlewareConfig
from tests.helpers.genai_traffic import MODEL, failing_upstream, scrape, send_requests

app = LatencyMiddleware(failing_upstream(), store=None, config=MiddlewareConfig.of(models=[MODEL]))
asyncio.run(send_requests(app))
if sys.argv[1] == "scrape":
    print(asyncio.run(scrape(app)))
app.close()
"""


def total(text: str, name: str, **labels: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def test_workers_add_up(tmp_path: Path) -> None:
    files = tmp_path / "prometheus"
    files.mkdir()
    # OTEL_METRICS_EXPORTER=prometheus: the gen_ai metrics on /metrics alone.
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(files),
        "PYTHONPATH": str(ROOT),
        "OTEL_METRICS_EXPORTER": "prometheus",
    }
    outputs = [
        subprocess.run(
            [sys.executable, "-c", WORKER, role],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        for role in ("serve", "serve", "scrape")
    ]
    text = outputs[-1]
    workers, failed = 3, sum(failed for *_, failed in REQUESTS)
    assert total(text, "gen_ai_server_request_duration_seconds_count") == workers * len(REQUESTS)
    assert total(
        text, "gen_ai_server_request_duration_seconds_count", error_type="server_error"
    ) == (workers * failed)
    assert total(text, "llm_slo_requests_total") == workers * len(REQUESTS)  # the same requests
    ok = len(REQUESTS) - failed
    assert total(text, "gen_ai_server_time_to_first_token_seconds_count") == workers * ok
    sent = sum(body["max_tokens"] for _, body, _, failed in REQUESTS if not failed)
    assert total(text, "gen_ai_client_inference_usage_output_tokens_total") == workers * sent
    env.pop("OTEL_METRICS_EXPORTER")
    env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path)  # a server of its own, OpenTelemetry off
    off = subprocess.run(
        [sys.executable, "-c", WORKER, "scrape"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "gen_ai_" not in off and total(off, "llm_slo_requests_total") == len(REQUESTS)
