"""`slo generate --kubernetes`: every manifest passes its schema (the CRDs' own for the
custom resources), the PrometheusRules hold exactly the groups of prometheus/rules.yml and pass
promtool and the generated promtool tests, and the sidecar component makes a valid
Deployment whose proxy arguments `slo proxy` itself accepts."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from alerts.kubernetes import (
    DASHBOARD_LABEL,
    KUSTOMIZATION_FILE,
    POD_MONITOR_FILE,
    RULES_FILE,
    SERVICE_MONITOR_FILE,
    Workload,
)
from alerts.sidecar import CONTAINER, SIDECAR_DIR, render_sidecar
from slo.cli import main
from slo.cli.proxy.command import configure as configure_proxy
from tests.helpers.binaries import binary
from tests.helpers.kubernetes_schemas import validate
from tests.helpers.kustomize import apply_component, apply_component_files

# The packaged example, and a short window with a tier whose name is no Kubernetes name.
SHORT = """
version: 1
window: 1h
tiers:
  - name: gold_chat
    default: true
    objectives: [p95 ttft <= 250ms, 99.5% of gaps itl <= 75ms, availability >= 99.95%]
  - name: offline
    match: {header: x-llm-tier}
    objectives: [p99 e2e <= 10s]
alert_policy:
  min_events: 5
  burn_rates:
    - {severity: page, long: 2m, short: 30s, factor: 10}
"""
SPECS = {"example": None, "short": SHORT}
SECURED = ["--ops-token-secret", "llm-slo-ops/token", "--tls-secret", "llm-slo-tls"]
RENAMED = ["--deployment", "vllm", "--namespace", "serving"]
ENGINE_ARGS = ["--model", "Qwen/Qwen2.5-0.5B-Instruct"]
ENGINE = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "llm-server", "namespace": "default"},
    "spec": {
        "selector": {"matchLabels": {"app": "llm"}},
        "template": {
            "metadata": {"labels": {"app": "llm"}},
            "spec": {
                "containers": [
                    {
                        "name": "engine",
                        "image": "vllm/vllm-openai:v0.11.0",
                        "args": ENGINE_ARGS,
                        "env": [{"name": "HF_HOME", "value": "/cache"}],
                    }
                ]
            },
        },
    },
}


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _generate(out: Path, spec_text: str | None, *flags: str) -> Path:
    args = ["generate", "--out", str(out), "--kubernetes", *flags]
    if spec_text is not None:
        (out / "slo.yaml").write_text(spec_text)
        args += ["--spec", str(out / "slo.yaml")]
    assert main(args) == 0
    return out


@pytest.fixture(scope="module", params=[(name, secured) for name in SPECS for secured in (0, 1)])
def generated(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    name, secured = request.param
    out = tmp_path_factory.mktemp(f"kubernetes-{name}-{secured}")
    return _generate(out, SPECS[name], *(SECURED if secured else []))


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _generate(tmp_path_factory.mktemp("kubernetes-secured"), None, *SECURED, *RENAMED)


def test_every_manifest_passes_its_schema(generated: Path) -> None:
    manifests = [
        doc
        for path in sorted((generated / "kubernetes").glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in _documents(path)
    ]
    kinds = {doc["kind"] for doc in manifests}
    assert {"PrometheusRule", "ServiceMonitor", "PodMonitor", "ConfigMap"} <= kinds
    assert "InferenceObjective" in kinds
    scaled = next(doc for doc in manifests if doc["kind"] == "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "llm-server"  # --deployment's default
    for manifest in manifests:
        validate(manifest)
    dashboards = [
        doc for doc in manifests if doc["metadata"].get("labels", {}).get("grafana_dashboard")
    ]
    assert dashboards and all(
        doc["metadata"]["labels"].items() >= DASHBOARD_LABEL.items() for doc in dashboards
    )
    for doc in dashboards:  # one key per dashboard, its JSON as `grafana/` has it
        ((key, text),) = doc["data"].items()
        assert json.loads(text) == json.loads((generated / "grafana" / key).read_text())


def test_the_sidecar_component_makes_a_valid_deployment(generated: Path) -> None:
    built = apply_component(generated / SIDECAR_DIR, ENGINE)
    for manifest in built:
        kubernetes_validate.validate(manifest, "1.30", strict=True)
    *_, deployment = built
    pod = deployment["spec"]["template"]["spec"]
    proxy = next(c for c in pod["containers"] if c["name"] == CONTAINER)
    engine = next(c for c in pod["containers"] if c["name"] == "engine")
    parser = argparse.ArgumentParser()
    configure_proxy(parser)
    args = parser.parse_args(proxy["args"])  # `slo proxy` takes what the sidecar runs
    assert args.upstream == f"http://127.0.0.1:{engine['args'][engine['args'].index('--port') + 1]}"
    traces = engine["args"][engine["args"].index("--otlp-traces-endpoint") + 1]
    assert traces.endswith(f":{args.port}/v1/traces")
    assert {"name": "HF_HOME", "value": "/cache"} in engine["env"]  # the engine's own kept
    assert proxy["readinessProbe"]["httpGet"]["path"] == "/health"
    service = next(m for m in built if m["kind"] == "Service")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert labels["app"] == "llm"  # the Deployment's selector still matches


def test_the_secured_sidecar_and_monitors_carry_the_token_and_tls(secured: Path) -> None:
    generated = secured
    monitors = _documents(generated / SERVICE_MONITOR_FILE) + _documents(
        generated / POD_MONITOR_FILE
    )
    for monitor in monitors:
        (endpoint,) = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["scheme"] == "https"
        assert endpoint["authorization"]["credentials"] == {"name": "llm-slo-ops", "key": "token"}
        assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "llm-slo-tls", "key": "ca.crt"}
    *_, deployment = apply_component(
        generated / SIDECAR_DIR, dict(ENGINE, metadata={"name": "vllm"})
    )
    (proxy,) = (
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == CONTAINER
    )
    assert "--ops-token-file" in proxy["args"] and "--ssl-certfile" in proxy["args"]
    assert proxy["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    (scaled,) = _documents(secured / "kubernetes/keda-scaledobject.yaml")
    assert (scaled["metadata"]["namespace"], scaled["spec"]["scaleTargetRef"]["name"]) == (
        "serving",
        "vllm",
    )


def _rule_groups(out: Path) -> list[dict[str, Any]]:
    return [group for rule in _documents(out / RULES_FILE) for group in rule["spec"]["groups"]]


def test_the_rules_are_exactly_the_rule_files_groups(generated: Path, tmp_path: Path) -> None:
    promtool = binary("promtool")
    rules = _documents(generated / RULES_FILE)
    groups = _rule_groups(generated)
    assert groups == yaml.safe_load((generated / "prometheus/rules.yml").read_text())["groups"]
    assert all(len(json.dumps(rule)) < 256 * 1024 for rule in rules)  # kubectl apply's limit
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    result = subprocess.run(
        [promtool, "check", "rules", "--lint=all", "--lint-fatal", "rules.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_generated_promtool_tests_pass_on_the_prometheus_rules(tmp_path: Path) -> None:
    """The groups as Prometheus Operator hands them to Prometheus, judged by the generated
    tests (one spec: test_generate.py runs them on rules.yml for every spec, and the groups
    are equal)."""
    promtool = binary("promtool")
    out = tmp_path / "out"
    out.mkdir()
    _generate(out, SPECS["short"])
    (tmp_path / "rules.yml").write_text(
        yaml.safe_dump({"groups": _rule_groups(out)}, sort_keys=False)
    )
    shutil.copy(out / "prometheus/rules_test.yml", tmp_path / "rules_test.yml")
    result = subprocess.run(
        [promtool, "test", "rules", "rules_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_kustomizations_name_files_that_exist(generated: Path) -> None:
    for path in (generated / KUSTOMIZATION_FILE, generated / SIDECAR_DIR / "kustomization.yaml"):
        (kustomization,) = _documents(path)
        named = kustomization["resources"] + [p["path"] for p in kustomization.get("patches", [])]
        assert named and all((path.parent / name).is_file() for name in named), named


@pytest.mark.parametrize(
    ("kind", "break_it", "field"),
    [
        ("ServiceMonitor", lambda m: m["spec"]["endpoints"][0].update(prot="slo-http"), "prot"),
        ("PrometheusRule", lambda m: m["spec"]["groups"][0].update(rulez=[]), "rulez"),
        ("InferenceObjective", lambda m: m["spec"].update(priority="high"), "high"),
        ("PodMonitor", lambda m: m["spec"].pop("selector"), "selector"),
    ],
)
def test_a_broken_manifest_fails_naming_the_field(
    kind: str, break_it: Any, field: str, secured: Path
) -> None:
    manifest = next(
        doc
        for path in sorted((secured / "kubernetes").glob("*.yaml"))
        for doc in _documents(path)
        if doc.get("kind") == kind
    )
    validate(manifest)
    break_it(manifest)
    with pytest.raises(jsonschema.ValidationError, match=field):
        validate(manifest)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ops-token-secret", "llm-slo-ops"], "--ops-token-secret 'llm-slo-ops': expected"),
        (["--deployment", "LLM_Server"], "--deployment 'LLM_Server': expected a Kubernetes"),
        (["--engine-port", "8000"], "--engine-port and --proxy-port must differ"),
        (["--monitor-label", "release"], "--monitor-label 'release': expected KEY=VALUE"),
        (["--proxy-arg=--stor=x"], "--proxy-arg '--stor=x': not a flag of slo proxy"),
        (["--proxy-arg=--max-connections=many"], "--proxy-arg: slo proxy refuses it"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", "--out", str(tmp_path / "out"), "--kubernetes", *flags]) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1, error


@pytest.mark.parametrize(
    ("engine", "flags"),
    [
        ("vllm", ["--otlp-traces-endpoint"]),
        ("sglang", ["--enable-trace", "--otlp-traces-endpoint"]),
        ("other", []),
    ],
)
def test_each_engine_gets_its_own_trace_flags(engine: str, flags: list[str]) -> None:
    workload = Workload(engine=engine)
    files = render_sidecar(workload, "version: 1\n")
    *_, deployment = apply_component_files(files, ENGINE)
    pod = deployment["spec"]["template"]["spec"]
    (engine_container,) = (c for c in pod["containers"] if c["name"] == "engine")
    added = engine_container["args"][len(ENGINE_ARGS) :]
    url = "http://127.0.0.1:8000/v1/traces"
    assert added == (["--host", "127.0.0.1", "--port", "8080", *flags, url] if flags else [])
    env = {e["name"]: e.get("value") for e in engine_container["env"]}
    assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == url  # any engine's SDK reads these
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
