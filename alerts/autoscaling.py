"""Kubernetes autoscaling on each tier's SLO headroom (`slo.headroom`): a KEDA ScaledObject
with one Prometheus trigger per tier, and an HPA on external metrics with the
prometheus-adapter rules that serve them. Rendered from `alerts/templates/keda_*.j2` and
`hpa_*.j2`; every metric name comes from the SLI catalog through `slo.headroom.promql`.
"""

from __future__ import annotations

from dataclasses import dataclass

from alerts.templating import render
from slo.headroom import DEFAULT_TARGET, GAUGE, promql, signals
from slo.sli import CATALOG
from slo.spec import SLOSpec
from slo.units import format_duration

KEDA_FILE = "kubernetes/keda-scaledobject.yaml"
HPA_FILE = "kubernetes/hpa.yaml"
ADAPTER_FILE = "kubernetes/prometheus-adapter-rules.yaml"


@dataclass(frozen=True)
class ScaleTarget:
    """The Deployment to scale and the bounds; the flags of `slo generate` set them."""

    name: str = "llm-server"
    namespace: str = "default"
    min_replicas: int = 1
    max_replicas: int = 10
    target: float = DEFAULT_TARGET
    prometheus_url: str = "http://prometheus.monitoring.svc:9090"


def _quantity(value: float) -> str:
    """A Kubernetes quantity: 0.7 -> "700m"."""
    return f"{round(value * 1000)}m"


def _triggers(spec: SLOSpec) -> list[dict[str, str]]:
    triggers = []
    for signal in signals(spec):
        metric = f"{GAUGE}_{signal.tier}".replace("-", "_")
        triggers.append(
            {
                "tier": signal.tier,
                "threshold": format_duration(signal.threshold_s),
                "query": promql(signal),
                "metric": metric,
                "series": f'{CATALOG["queue_depth"].metric}{{tier="{signal.tier}"}}',
                "adapter_query": promql(signal, by="namespace"),
            }
        )
    return triggers


def render_autoscaling(spec: SLOSpec, target: ScaleTarget | None = None) -> dict[str, str]:
    """{path: text} of the three manifests; empty when no tier has a TTFT objective."""
    target = target or ScaleTarget()
    triggers = _triggers(spec)
    if not triggers:
        return {}
    context = {
        "target": target,
        "triggers": [dict(t, quantity=_quantity(target.target)) for t in triggers],
    }
    return {
        KEDA_FILE: render("keda_scaledobject.yaml.j2", **context),
        HPA_FILE: render("hpa_autoscaler.yaml.j2", **context),
        ADAPTER_FILE: render("hpa_prometheus_adapter.yaml.j2", **context),
    }
