"""`slo generate`'s prometheus/prometheus.yml: the scrape job for the replicas' /metrics, with
the rules beside it, over HTTPS and with the operations token when they are served so.

    scrape_configs:
      - job_name: llm-slo
        scheme: https
        tls_config: {ca_file: /etc/llm-slo/ca.pem}
        authorization: {credentials_file: /etc/llm-slo/ops-token}
        static_configs: [{targets: ["10.0.0.5:8000"]}]

The token stays in its file: Prometheus reads `credentials_file` at every scrape, so a rotated
token is picked up without a reload, and the config can be shared without the secret.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from slo.cli.common.flags import add_pem_flag
from slo.errors import UsageError

JOB_NAME = "llm-slo"


@dataclass(frozen=True)
class Scrape:
    """How Prometheus reaches the replicas' /metrics."""

    targets: tuple[str, ...] = ("127.0.0.1:8000",)
    scheme: str = "http"
    ops_token_file: str | None = None  # the path as Prometheus sees it
    ca_file: str | None = None
    interval: str = "15s"


def add_scrape_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("prometheus/prometheus.yml (the scrape job)")
    group.add_argument(
        "--scrape-target",
        action="append",
        default=None,
        metavar="HOST:PORT",
        help="a replica's address; repeat for each (default: 127.0.0.1:8000)",
    )
    group.add_argument(
        "--scrape-scheme",
        choices=("http", "https"),
        default=None,
        help="how Prometheus reaches them (default: https with --scrape-ca-file, else http)",
    )
    add_pem_flag(
        group,
        "--scrape-ca-file",
        "the CA that signed the replicas' certificates, as a path on the Prometheus host",
    )
    group.add_argument(
        "--ops-token-file",
        default=None,
        metavar="FILE",
        help="the replicas' operations token file, as a path on the Prometheus host: the job "
        "sends 'Authorization: Bearer <its first line>' (authorization.credentials_file)",
    )


def scrape_from_args(args: argparse.Namespace) -> Scrape:
    targets = tuple(args.scrape_target or Scrape.targets)
    for target in targets:
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit():
            raise UsageError(f"--scrape-target {target!r}: expected HOST:PORT, e.g. 10.0.0.5:8000")
    ca_file: str | None = args.scrape_ca_file
    scheme = args.scrape_scheme or ("https" if ca_file else "http")
    if ca_file and scheme == "http":
        raise UsageError("--scrape-ca-file needs --scrape-scheme https (or leave the scheme out)")
    return Scrape(targets, scheme, args.ops_token_file, ca_file)


def prometheus_config(scrape: Scrape, rule_files: list[str]) -> dict[str, Any]:
    job: dict[str, Any] = {
        "job_name": JOB_NAME,
        "scheme": scrape.scheme,
        "metrics_path": "/metrics",
    }
    if scrape.ca_file is not None:
        job["tls_config"] = {"ca_file": scrape.ca_file}
    if scrape.ops_token_file is not None:
        job["authorization"] = {"type": "Bearer", "credentials_file": scrape.ops_token_file}
    job["static_configs"] = [{"targets": list(scrape.targets)}]
    return {
        "global": {"scrape_interval": scrape.interval, "evaluation_interval": scrape.interval},
        "rule_files": rule_files,
        "scrape_configs": [job],
    }


def write_prometheus_config(scrape: Scrape, out: Path) -> Path:
    """prometheus/prometheus.yml under `out`, loading the rules written beside it."""
    path = out / "prometheus" / "prometheus.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# Written by `slo generate`; the scrape job for llm-slo (docs/security.md).\n"
    config = prometheus_config(scrape, ["rules.yml"])
    path.write_text(header + yaml.safe_dump(config, sort_keys=False))
    return path
