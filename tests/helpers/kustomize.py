"""What `kubectl apply -k` makes of the generated sidecar component, for the cases it is
written for: the JSON patch's `add .../-` appends, then the strategic merge (maps merged,
containers, env, volumes and volume mounts merged by `name`, other lists replaced). The
result is a whole Deployment that the Kubernetes schema can judge."""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

MERGE_KEY = "name"  # the patch merge key of containers, env, volumes, volumeMounts, ports


def _merge_lists(base: list[Any], patch: list[Any]) -> list[Any]:
    if not all(isinstance(item, dict) and MERGE_KEY in item for item in (*base, *patch)):
        return copy.deepcopy(patch)
    merged = copy.deepcopy(base)
    for item in patch:
        same = next((m for m in merged if m[MERGE_KEY] == item[MERGE_KEY]), None)
        if same is None:
            merged.append(copy.deepcopy(item))
        else:
            merged[merged.index(same)] = strategic_merge(same, item)
    return merged


def strategic_merge(base: Any, patch: Any) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = copy.deepcopy(base)
        for key, value in patch.items():
            merged[key] = strategic_merge(base[key], value) if key in base else value
        return merged
    if isinstance(base, list) and isinstance(patch, list):
        return _merge_lists(base, patch)
    return copy.deepcopy(patch)


def json_patch(document: Any, operations: list[dict[str, Any]]) -> Any:
    """The `add` operations of RFC 6902 (all the component writes)."""
    document = copy.deepcopy(document)
    for operation in operations:
        assert operation["op"] == "add", operation
        *parents, last = operation["path"].strip("/").split("/")
        node = document
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if last == "-":
            node.append(operation["value"])
        elif isinstance(node, list):
            node.insert(int(last), operation["value"])
        else:
            node[last] = operation["value"]
    return document


def apply_component(component_dir: Path, deployment: dict[str, Any]) -> list[dict[str, Any]]:
    """The component's resources and the Deployment its patches make, in kustomize's order
    (patches in the order listed)."""
    component = yaml.safe_load((component_dir / "kustomization.yaml").read_text())
    assert component["kind"] == "Component", component
    resources = [
        yaml.safe_load((component_dir / path).read_text()) for path in component["resources"]
    ]
    for patch in component["patches"]:
        target = patch["target"]
        assert (target["kind"], target["name"]) == (
            deployment["kind"],
            deployment["metadata"]["name"],
        ), target
        body = yaml.safe_load((component_dir / patch["path"]).read_text())
        if isinstance(body, list):
            deployment = json_patch(deployment, body)
        else:
            deployment = strategic_merge(deployment, body)
    return [*resources, deployment]


def apply_component_files(
    files: Mapping[str, str], deployment: dict[str, Any]
) -> list[dict[str, Any]]:
    """`apply_component` on rendered {path: text} (`alerts.sidecar.render_sidecar`)."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for relative, text in files.items():
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / relative).write_text(text)
        (component,) = {(root / relative).parent for relative in files}
        return apply_component(component, deployment)
