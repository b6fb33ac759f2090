"""Every generated Kubernetes manifest against its schema: the core kinds with
kubernetes-validate, the custom resources with the CRDs' own OpenAPI schemas kept in
tests/schemas/ (each says the release it came from). The API server rejects a field its
schema does not name (field validation `Strict`, kubectl's default): the schemas are made to
do the same, every object with `properties` closed unless it preserves unknown fields."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

KUBERNETES = "1.30"
SCHEMAS = Path(__file__).parents[1] / "schemas"
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule_v1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor_v1.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor_v1.json",
    ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective"): (
        "inferenceobjective_v1alpha2.json"
    ),
    ("keda.sh/v1alpha1", "ScaledObject"): "keda_scaledobject_v1alpha1.json",
}
# ObjectMeta as the API server checks it for what we write: a DNS-1123 name, string labels.
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"},
        "namespace": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


def _python_pattern(pattern: str) -> str:
    """The API server's patterns are Go's (RE2), which take a flag group anywhere: Python's
    `re` wants it first."""
    return "(?i)^" + pattern[len("^(?i)") :] if pattern.startswith("^(?i)") else pattern


def _closed(node: Any) -> Any:
    if isinstance(node, dict):
        node = {key: _closed(value) for key, value in node.items()}
        if isinstance(node.get("pattern"), str):
            node["pattern"] = _python_pattern(node["pattern"])
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        return node
    if isinstance(node, list):
        return [_closed(value) for value in node]
    return node


@cache
def crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    """The kind's schema, closed, with ObjectMeta checked."""
    schema = json.loads((SCHEMAS / CRD_SCHEMAS[api_version, kind]).read_text())
    schema = _closed(schema)
    schema["properties"]["metadata"] = copy.deepcopy(_METADATA)
    schema["required"] = sorted({*schema.get("required", ()), "apiVersion", "kind", "metadata"})
    return schema


def validate(manifest: dict[str, Any]) -> None:
    """Raise (jsonschema's or kubernetes-validate's ValidationError, naming the field) unless
    the manifest is valid for its kind."""
    key = (manifest.get("apiVersion", ""), manifest.get("kind", ""))
    if key in CRD_SCHEMAS:
        jsonschema.validate(manifest, crd_schema(*key))
    else:
        kubernetes_validate.validate(manifest, KUBERNETES, strict=True)
