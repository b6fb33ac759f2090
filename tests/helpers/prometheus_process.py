"""Real Prometheus (and Alertmanager) processes on 127.0.0.1 for integration tests."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from slo.cli.bench.server import free_port, stop_process
from tests.helpers.binaries import binary
from tests.helpers.polling import wait_until_ready


@contextlib.contextmanager
def process(command: list[str], ready_url: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("w") as output:
        running = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        try:
            wait_until_ready(ready_url, timeout_s=60, process=running)
            yield running
        finally:
            stop_process(running, timeout_s=20)


@contextlib.contextmanager
def prometheus(
    tmp_path: Path,
    targets: list[str],
    rule_files: Sequence[str] = (),
    alertmanager: str | None = None,
    interval: str = "1s",
) -> Iterator[str]:
    """A Prometheus scraping `targets` (host:port) and evaluating `rule_files` every
    `interval`, alerting `alertmanager` (host:port) when given; yields its base URL."""
    port = free_port()
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": interval,
        },
        "rule_files": list(rule_files),
        "scrape_configs": [{"job_name": "llm-slo", "static_configs": [{"targets": targets}]}],
    }
    if alertmanager is not None:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    command = [
        binary("prometheus"),
        f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'prom-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    url = f"http://127.0.0.1:{port}"
    with process(command, f"{url}/-/ready", tmp_path / "prometheus.log"):
        yield url


def query(prometheus_url: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    response = httpx.get(f"{prometheus_url}/api/v1/query", params=params, timeout=10)
    payload = response.json()
    assert payload["status"] == "success", (expr, payload)
    return list(payload["data"]["result"])
