"""The Kubernetes manifests the docs show are the ones `slo generate --kubernetes` writes:
docs/kubernetes.md's command is run, and every yaml block that names a generated file on its
first line (`# llm-slo/kubernetes/...`, in docs/kubernetes.md and docs/proxy.md) equals that
file; the spec example there parses and resolves as the page says."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from slo.cli import main
from slo.spec import SLOSpec
from tests.helpers.kubernetes_schemas import validate
from tests.helpers.kustomize import apply_component

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("docs/kubernetes.md", "docs/proxy.md")
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
OUT = "llm-slo"


def _blocks(page: str, language: str) -> list[str]:
    return [m.group(2) for m in FENCE.finditer((ROOT / page).read_text()) if m.group(1) == language]


def _command() -> list[str]:
    """docs/kubernetes.md's `slo generate ... --kubernetes`, its arguments."""
    for block in _blocks("docs/kubernetes.md", "bash"):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            if line.startswith("slo generate") and "--kubernetes" in line:
                words = shlex.split(line.split(">", 1)[0])
                return words[1:]
    raise AssertionError("docs/kubernetes.md runs no `slo generate --kubernetes`")


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docs-kubernetes")
    args = _command()
    args[args.index("--out") + 1] = str(root / OUT)
    assert main(args) == 0
    return root


def _shown() -> list[tuple[str, str, str]]:
    found = []
    for page in PAGES:
        for block in _blocks(page, "yaml"):
            first = block.splitlines()[0]
            if first.startswith(f"# {OUT}/"):
                found.append((page, first.removeprefix("# "), block))
    return found


def test_the_shown_manifests_are_the_generated_ones(generated: Path) -> None:
    shown = _shown()
    pages = {page for page, _, _ in shown}
    assert pages == set(PAGES), pages  # the proxy page's sidecar example is one of them
    assert f"{OUT}/kubernetes/sidecar/deployment-patch.yaml" in {path for _, path, _ in shown}
    for page, path, block in shown:
        written = list(yaml.safe_load_all((generated / path).read_text()))
        assert list(yaml.safe_load_all(block)) == written, f"{page}: {path} differs"


def test_the_docs_deployment_made_by_the_component_is_valid(generated: Path) -> None:
    args = _command()
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": args[args.index("--deployment") + 1]},
        "spec": {
            "selector": {"matchLabels": {"app": "llm"}},
            "template": {
                "metadata": {"labels": {"app": "llm"}},
                "spec": {"containers": [{"name": "engine", "image": "vllm", "args": []}]},
            },
        },
    }
    for manifest in apply_component(generated / OUT / "kubernetes/sidecar", deployment):
        validate(manifest)


def test_the_objective_header_example_resolves_as_described() -> None:
    (example,) = [b for b in _blocks("docs/kubernetes.md", "yaml") if "objective_header" in b]
    spec = SLOSpec.from_yaml("version: 1\n" + example)
    header = spec.objective_header
    assert header == "x-gateway-inference-objective"
    assert spec.resolve_tier({header: "chat-premium"}, "/").name == "premium"
    assert spec.resolve_tier({header: "premium"}, "/").name == "standard"  # named otherwise
