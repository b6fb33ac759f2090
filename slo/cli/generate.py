"""`slo generate`: dashboards, alert rules and their tests, Alertmanager config, runbooks, the
scrape job and autoscaling manifests from one spec."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slo.cli.common.flags import SHOWN_DEFAULT, add_pem_flag, add_spec_flag
from slo.cli.kubernetes_flags import add_kubernetes_flags, workload_from_args
from slo.cli.paths import output_directory
from slo.cli.scrape_config import (
    Scrape,
    add_scrape_flags,
    scrape_from_args,
    write_prometheus_config,
)
from slo.errors import UsageError

if TYPE_CHECKING:
    from alerts.kubernetes import Workload
    from slo.spec import SLOSpec

HELP = "write Grafana dashboards, Prometheus rules and tests, Alertmanager config, runbooks"
DESCRIPTION = (
    "Render, from one SLO spec, grafana/*.json (+ provisioning), "
    "prometheus/rules.yml and its promtool tests prometheus/rules_test.yml and "
    "prometheus/anomaly_rules_test.yml, "
    "prometheus/prometheus.yml (the scrape job: --scrape-*, --ops-token-file), "
    "alertmanager/alertmanager.yml, runbooks/*.md and kubernetes/ (KEDA ScaledObject, HPA and "
    "prometheus-adapter rules on each tier's SLO headroom) under --out; with --kubernetes, "
    "also the PrometheusRules, monitors, dashboard ConfigMaps, InferenceObjectives and the "
    "sidecar's Kustomize component there."
)


@dataclass(frozen=True)
class Targets:
    """Where the generated files point: the services they link to or post to."""

    webhook_url: str = "http://127.0.0.1:5001/llm-slo/alerts"
    # A webhook behind a bearer token or a private CA: the files Alertmanager reads them from.
    webhook_token_file: str | None = None
    webhook_ca_file: str | None = None
    runbook_url: str = "https://runbooks.example.com/llm-slo"
    grafana_url: str = "http://localhost:3000"
    prometheus_url: str = "http://localhost:9090"

    def webhook_http_config(self) -> dict[str, Any] | None:
        """Alertmanager's `http_config` for every webhook: a bearer token and a CA, as files
        (Alertmanager reads them; nothing secret is written into the config)."""
        config: dict[str, Any] = {}
        if self.webhook_token_file:
            config["authorization"] = {
                "type": "Bearer",
                "credentials_file": self.webhook_token_file,
            }
        if self.webhook_ca_file:
            config["tls_config"] = {"ca_file": self.webhook_ca_file}
        return config or None


# The services the files point to: each flag's default is the Targets field of its name.
_URL_FLAGS = {
    "--webhook-url": "URL every Alertmanager receiver posts to",
    "--runbook-url": "base URL of the published runbooks/",
    "--grafana-url": "Grafana base URL for the alerts' dashboard links",
    "--prometheus-url": "Prometheus URL for the Grafana datasource",
}


def configure(parser: argparse.ArgumentParser) -> None:
    defaults = Targets()
    add_spec_flag(parser)
    parser.add_argument("--out", required=True, help="directory to write into (created)")
    for flag, help in _URL_FLAGS.items():
        default = getattr(defaults, flag.removeprefix("--").replace("-", "_"))
        parser.add_argument(flag, default=default, help=help + SHOWN_DEFAULT)
    parser.add_argument(
        "--webhook-token-file",
        metavar="FILE",
        help="Alertmanager sends 'Authorization: Bearer <this file's content>' to --webhook-url "
        "(a path on Alertmanager's machine)",
    )
    add_pem_flag(
        parser,
        "--webhook-ca-file",
        "Alertmanager verifies an https:// --webhook-url against this CA (a path on "
        "Alertmanager's machine)",
    )
    add_scrape_flags(parser)
    add_kubernetes_flags(parser)


def run(args: argparse.Namespace) -> int:
    targets = Targets(
        args.webhook_url,
        args.webhook_token_file,
        args.webhook_ca_file,
        args.runbook_url,
        args.grafana_url,
        args.prometheus_url,
    )
    workload = workload_from_args(args) if args.kubernetes else None
    generate(args.spec, Path(args.out), targets, scrape_from_args(args), workload)
    return 0


def generate(
    spec_path: str | None,
    out: Path,
    targets: Targets,
    scrape: Scrape | None = None,
    workload: Workload | None = None,
) -> list[Path]:
    """Write everything under `out` and list it on stdout; the paths written. With a
    `workload`, the Kubernetes resources too (`write_kubernetes`)."""
    from alerts import Links, write_alerts
    from dashboards import OVERVIEW_UID, write_dashboards
    from slo.alert_rules import unbucketed_thresholds, unreachable
    from slo.spec import SLOSpec

    spec = SLOSpec.load(spec_path) if spec_path else SLOSpec.default()
    problems = unbucketed_thresholds(spec)
    if problems:
        raise UsageError(problems[0])
    output_directory(out)
    links = Links(targets.runbook_url, f"{targets.grafana_url.rstrip('/')}/d/{OVERVIEW_UID}")
    http_config = targets.webhook_http_config()
    written = write_alerts(spec, out, links, targets.webhook_url, http_config=http_config)
    written += write_dashboards(spec, out, targets.prometheus_url)
    written.append(write_prometheus_config(scrape or Scrape(), out))
    from alerts.autoscaling import (  # KEDA and HPA on each tier's headroom
        ScaleTarget,
        render_autoscaling,
    )
    from slo.files import write_tree

    # The autoscalers scale the sidecar's Deployment when there is one.
    scaled = ScaleTarget(workload.deployment, workload.namespace) if workload else ScaleTarget()
    written += write_tree(out, render_autoscaling(spec, scaled))
    if workload is not None:
        written += write_kubernetes(spec, spec_path, out, workload)
    for note in unreachable(spec):
        print(f"note: {note}", file=sys.stderr)
    print(f"wrote {len(written)} files under {out}")
    for path in sorted(written):
        print(f"  {path.relative_to(out)}")
    return written


def write_kubernetes(
    spec: SLOSpec, spec_path: str | None, out: Path, workload: Workload
) -> list[Path]:
    """kubernetes/ from the files just written: the rules and dashboards as resources, the
    monitors, the tiers' InferenceObjectives and the sidecar's component (with the spec)."""
    from alerts import RULES_FILE
    from alerts.kubernetes import render_monitoring
    from alerts.sidecar import render_sidecar
    from slo.files import write_tree
    from slo.spec import example_text

    rules_text = (out / RULES_FILE).read_text(encoding="utf-8")
    dashboards = {
        path.name: path.read_text(encoding="utf-8") for path in out.glob("grafana/*.json")
    }
    spec_text = Path(spec_path).read_text(encoding="utf-8") if spec_path else example_text()
    files = render_monitoring(spec, rules_text, dashboards, workload)
    files.update(render_sidecar(workload, spec_text))
    return write_tree(out, files)
