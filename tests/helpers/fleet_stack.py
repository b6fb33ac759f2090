"""A small fleet on 127.0.0.1 for integration tests: `slo serve` replicas started together, a
PostgreSQL schema of its own, Prometheus and Alertmanager with the generated files, and a
webhook that keeps what Alertmanager posts."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from slo.cli.bench.server import free_port, stop_process
from tests.helpers.prometheus_process import binary, process
from tests.helpers.prometheus_process import prometheus as shared_prometheus
from tests.helpers.servers import json_receiver, wait_until_ready


def record_count(store_url: str) -> int:
    from sqlalchemy import create_engine, func, select

    from slo.store import TABLE

    engine = create_engine(store_url)
    try:
        with engine.connect() as connection:
            return int(connection.execute(select(func.count()).select_from(TABLE)).scalar_one())
    finally:
        engine.dispose()


@contextlib.contextmanager
def replicas(
    tmp_path: Path, *arguments: Sequence[str], env: dict[str, str] | None = None
) -> Iterator[list[str]]:
    """`slo serve` once per argument list, all started before any is waited for (their
    warm-ups overlap); yields the base URLs in the same order. Logs go to tmp_path."""
    started: list[tuple[str, subprocess.Popen[bytes]]] = []
    logs = []
    try:
        for index, args in enumerate(arguments):
            port = free_port()
            log = (tmp_path / f"replica-{index}.log").open("wb")
            logs.append(log)
            command = [sys.executable, "-m", "slo.cli", "serve", "--host", "127.0.0.1",
                       "--port", str(port), *args]  # fmt: skip
            running = subprocess.Popen(
                command, env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT
            )
            started.append((f"http://127.0.0.1:{port}", running))
        for base_url, running in started:
            wait_until_ready(base_url + "/health", timeout_s=120, process=running)
        yield [base_url for base_url, _ in started]
    finally:
        for _, running in started:
            stop_process(running)
        for log in logs:
            log.close()


@contextlib.contextmanager
def webhook() -> Iterator[tuple[str, list[Any]]]:
    """A webhook in a thread: yields its URL and the list every posted body lands in."""
    with json_receiver("/alerts") as receiver:
        yield receiver


@contextlib.contextmanager
def alertmanager(tmp_path: Path, config: Path) -> Iterator[str]:
    """A single Alertmanager (no gossip port) with `config`; yields host:port."""
    port = free_port()
    command = [
        binary("prometheus-alertmanager", "alertmanager"),
        f"--config.file={config}",
        f"--storage.path={tmp_path / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]
    address = f"127.0.0.1:{port}"
    with process(command, f"http://{address}/-/ready", tmp_path / "alertmanager.log"):
        yield address


@contextlib.contextmanager
def prometheus(
    tmp_path: Path,
    targets: list[str],
    rule_file: Path,
    alertmanager_address: str,
    interval: str,
) -> Iterator[str]:
    """A Prometheus scraping `targets` and evaluating `rule_file` every `interval`, sending
    alerts to `alertmanager_address`; yields its base URL."""
    with shared_prometheus(
        tmp_path, targets, [str(rule_file)], alertmanager_address, interval=interval
    ) as url:
        yield url
