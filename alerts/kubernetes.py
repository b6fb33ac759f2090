"""`slo generate --kubernetes`: the rules, the scrape, the dashboards and the tiers as the
resources Kubernetes operators apply. PrometheusRules (one per group of `prometheus/rules.yml`,
each under the 256 KiB a client-side `kubectl apply` can annotate), a ServiceMonitor and a
PodMonitor for the sidecar's /metrics, one ConfigMap per dashboard for Grafana's dashboard
sidecar, one InferenceObjective per tier (Gateway API Inference Extension), and the Kustomize
files that apply them (the sidecar itself is `alerts.sidecar`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from slo.spec import SLOSpec

DIR = "kubernetes"
KUSTOMIZATION_FILE = f"{DIR}/kustomization.yaml"
RULES_FILE = f"{DIR}/prometheusrules.yaml"
SERVICE_MONITOR_FILE = f"{DIR}/servicemonitor.yaml"
POD_MONITOR_FILE = f"{DIR}/podmonitor.yaml"
DASHBOARDS_FILE = f"{DIR}/grafana-dashboards.yaml"
OBJECTIVES_FILE = f"{DIR}/inferenceobjectives.yaml"
# Grafana's dashboard sidecar (the Grafana Helm chart, kube-prometheus-stack) loads every
# ConfigMap with this label.
DASHBOARD_LABEL = {"grafana_dashboard": "1"}
PORT_NAME = "slo-http"
MONITORING = "monitoring.coreos.com/v1"
INFERENCE = "inference.networking.x-k8s.io/v1alpha2"


@dataclass(frozen=True)
class Workload:
    """The Deployment the sidecar joins and how the sidecar is served; the flags of
    `slo generate --kubernetes` set them."""

    deployment: str = "llm-server"
    namespace: str = "default"
    engine: str = "vllm"  # vllm, sglang, or other (no engine arguments added)
    engine_container: str = "engine"
    engine_port: int = 8080
    port: int = 8000
    image: str = "ghcr.io/example/llm-slo:0.1.0"
    model: str | None = None
    ops_token_secret: tuple[str, str] | None = None  # (Secret name, key)
    tls_secret: str | None = None  # a kubernetes.io/tls Secret: tls.crt, tls.key, ca.crt
    inference_pool: str | None = None
    labels: tuple[tuple[str, str], ...] = ()  # on the rules and monitors (a Prometheus selector)
    proxy_args: tuple[str, ...] = ()  # more `slo proxy` flags, as given

    @property
    def service(self) -> str:
        return f"{self.deployment}-slo"

    @property
    def selector(self) -> dict[str, str]:
        """The label the sidecar puts on the Deployment's Pods, and the Service selects."""
        return {"llm-slo/sidecar": self.deployment}

    @property
    def scheme(self) -> str:
        return "https" if self.tls_secret else "http"

    @property
    def host(self) -> str:
        """The name the Service answers to, the one the certificate must carry."""
        return f"{self.service}.{self.namespace}.svc"


def kubernetes_name(name: str) -> str:
    """A Kubernetes object name from a rule group's or tier's name (no '_')."""
    return name.replace("_", "-").lower()


def dump_all(documents: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(documents, sort_keys=False, width=100)


HEADER = "# Written by `slo generate --kubernetes` (docs/kubernetes.md).\n"


def _metadata(name: str, workload: Workload, labels: dict[str, str] | None = None) -> Any:
    """Name, namespace and labels; the rules and monitors (no `labels`) also carry the
    workload's labels, which Prometheus' rule and monitor selectors match."""
    selected = dict(workload.labels) if labels is None else labels
    all_labels = {"app.kubernetes.io/part-of": "llm-slo", **selected}
    return {"name": name, "namespace": workload.namespace, "labels": all_labels}


def prometheus_rules(rules_text: str, workload: Workload) -> list[dict[str, Any]]:
    """One PrometheusRule per group of the rule file, the group unchanged."""
    groups = yaml.safe_load(rules_text)["groups"]
    return [
        {
            "apiVersion": MONITORING,
            "kind": "PrometheusRule",
            "metadata": _metadata(kubernetes_name(group["name"]), workload),
            "spec": {"groups": [group]},
        }
        for group in groups
    ]


def _endpoint(workload: Workload) -> dict[str, Any]:
    endpoint: dict[str, Any] = {
        "port": PORT_NAME,
        "path": "/metrics",
        "interval": "15s",
        "scheme": workload.scheme,
    }
    if workload.ops_token_secret is not None:
        name, key = workload.ops_token_secret
        endpoint["authorization"] = {"type": "Bearer", "credentials": {"name": name, "key": key}}
    if workload.tls_secret is not None:
        endpoint["tlsConfig"] = {
            "ca": {"secret": {"name": workload.tls_secret, "key": "ca.crt"}},
            "serverName": workload.host,
        }
    return endpoint


def monitors(workload: Workload) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the ServiceMonitor, the PodMonitor): the same scrape, through the Service or of each
    Pod; apply one of them."""
    selector = {"matchLabels": workload.selector}
    service = {
        "apiVersion": MONITORING,
        "kind": "ServiceMonitor",
        "metadata": _metadata(workload.service, workload),
        "spec": {"selector": selector, "endpoints": [_endpoint(workload)]},
    }
    pod = {
        "apiVersion": MONITORING,
        "kind": "PodMonitor",
        "metadata": _metadata(workload.service, workload),
        "spec": {"selector": selector, "podMetricsEndpoints": [_endpoint(workload)]},
    }
    return service, pod


def dashboard_config_maps(dashboards: dict[str, str], workload: Workload) -> list[dict[str, Any]]:
    """One ConfigMap per dashboard (each holds its JSON under its file name)."""
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _metadata(
                kubernetes_name(f"grafana-{name.removesuffix('.json')}"),
                workload,
                DASHBOARD_LABEL,
            ),
            "data": {name: text},
        }
        for name, text in sorted(dashboards.items())
    ]


def objective_priorities(spec: SLOSpec) -> dict[str, int]:
    """Each tier's InferenceObjective priority from the tier order: the tier served first
    (lowest spec priority, then spec order) gets the highest, the last 0."""
    ranked = sorted(spec.tiers, key=lambda tier: (tier.priority, spec.tiers.index(tier)))
    return {tier.name: len(ranked) - 1 - rank for rank, tier in enumerate(ranked)}


def inference_objectives(spec: SLOSpec, workload: Workload) -> list[dict[str, Any]]:
    """One InferenceObjective per tier, named by the tier's first objective name: a request
    the gateway tags with it (the objective header) is measured under that tier."""
    priorities = objective_priorities(spec)
    pool = workload.inference_pool or workload.deployment
    return [
        {
            "apiVersion": INFERENCE,
            "kind": "InferenceObjective",
            "metadata": _metadata(tier.objective_names[0], workload, {"llm-slo/tier": tier.name}),
            "spec": {"priority": priorities[tier.name], "poolRef": {"name": pool}},
        }
        for tier in spec.tiers
    ]


def render_monitoring(
    spec: SLOSpec, rules_text: str, dashboards: dict[str, str], workload: Workload
) -> dict[str, str]:
    """{path: text} of the rules, the monitors, the dashboards, the objectives and the
    kustomization applying the first three (the PodMonitor and the objectives are applied
    by choice: docs/kubernetes.md)."""
    service_monitor, pod_monitor = monitors(workload)
    header = HEADER
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [
            path.removeprefix(f"{DIR}/")
            for path in (RULES_FILE, SERVICE_MONITOR_FILE, DASHBOARDS_FILE)
        ],
    }
    return {
        RULES_FILE: header + dump_all(prometheus_rules(rules_text, workload)),
        SERVICE_MONITOR_FILE: header + dump_all([service_monitor]),
        POD_MONITOR_FILE: header + dump_all([pod_monitor]),
        DASHBOARDS_FILE: header + dump_all(dashboard_config_maps(dashboards, workload)),
        OBJECTIVES_FILE: header + dump_all(inference_objectives(spec, workload)),
        KUSTOMIZATION_FILE: header + dump_all([kustomization]),
    }
