"""The generated autoscaling manifests pass their schemas (Kubernetes' for the HPA and the
adapter's ConfigMap, KEDA's CRD schema for the ScaledObject), and their PromQL computes the
same headroom as the in-process gauge (promtool)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from alerts.autoscaling import ADAPTER_FILE, HPA_FILE, KEDA_FILE, ScaleTarget, render_autoscaling
from slo.headroom import promql, signals
from slo.spec import SLOSpec
from tests.helpers.binaries import binary

KUBERNETES = "1.30"
KEDA_SCHEMA = json.loads(
    (Path(__file__).parents[2] / "schemas" / "keda_scaledobject_v1alpha1.json").read_text()
)
TARGET = ScaleTarget("vllm", "serving", 2, 12, 0.6, "http://prometheus:9090")


@pytest.fixture(scope="module")
def manifests() -> dict[str, Any]:
    return {
        path: yaml.safe_load(text)
        for path, text in render_autoscaling(SLOSpec.default(), TARGET).items()
    }


def test_the_scaled_object_passes_kedas_schema(manifests: dict[str, Any]) -> None:
    scaled = manifests[KEDA_FILE]
    jsonschema.validate(scaled, KEDA_SCHEMA)
    triggers = scaled["spec"]["triggers"]
    assert [t["name"] for t in triggers] == ["headroom-premium", "headroom-standard"]
    assert {t["metadata"]["threshold"] for t in triggers} == {"0.6"}
    assert scaled["spec"]["scaleTargetRef"]["name"] == "vllm"
    broken = json.loads(json.dumps(scaled))
    del broken["spec"]["scaleTargetRef"]  # the schema can fail
    with pytest.raises(jsonschema.ValidationError, match="scaleTargetRef"):
        jsonschema.validate(broken, KEDA_SCHEMA)


def test_the_hpa_and_the_adapter_rules_pass_kubernetes_schemas(manifests: dict[str, Any]) -> None:
    hpa, adapter = manifests[HPA_FILE], manifests[ADAPTER_FILE]
    kubernetes_validate.validate(hpa, KUBERNETES, strict=True)
    kubernetes_validate.validate(adapter, KUBERNETES, strict=True)
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]["external"]
    served = [rule["name"]["as"] for rule in rules]
    asked = [metric["external"]["metric"]["name"] for metric in hpa["spec"]["metrics"]]
    assert (
        served
        == asked
        == ["llm_slo_ttft_headroom_ratio_premium", "llm_slo_ttft_headroom_ratio_standard"]
    )
    assert {m["external"]["target"]["value"] for m in hpa["spec"]["metrics"]} == {"600m"}
    broken = json.loads(json.dumps(hpa))
    broken["spec"]["maxReplicas"] = "many"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def test_no_ttft_objective_no_manifests() -> None:
    spec = SLOSpec.from_yaml(
        "version: 1\ntiers:\n  - name: batch\n    default: true\n    objectives: [p99 e2e <= 60s]\n"
    )
    assert render_autoscaling(spec) == {}


def test_prometheus_computes_the_same_ratio_as_the_gauge(tmp_path: Path) -> None:
    """The case of tests/unit/slo/test_headroom.py: 2 premium requests waiting, 10 finished a
    second, 50 ms mean prefill: (2 / 10 + 0.05) / 0.2 = 1.25; standard (4 more waiting, TTFT
    objective 500 ms in the packaged spec): 6 / 10 / 0.5 = 1.2."""
    promtool = binary("promtool")
    premium, standard = signals(SLOSpec.default())
    rules = {
        "groups": [
            {
                "name": "headroom",
                "rules": [
                    {"record": f"headroom:{s.tier}", "expr": promql(s)} for s in (premium, standard)
                ],
            }
        ]
    }
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    series = [
        ('llm_slo_queue_depth{tier="premium"}', "2x10"),
        ('llm_slo_queue_depth{tier="standard"}', "4x10"),
        ('llm_slo_requests_total{tier="premium",outcome="ok"}', "0+600x10"),
        ('llm_slo_prefill_time_seconds_sum{tier="premium"}', "0+30x10"),
        ('llm_slo_prefill_time_seconds_count{tier="premium"}', "0+600x10"),
        ('llm_slo_prefill_time_seconds_sum{tier="standard"}', "0x10"),
        ('llm_slo_prefill_time_seconds_count{tier="standard"}', "0x10"),
    ]
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": name, "values": values} for name, values in series],
                "promql_expr_test": [
                    {
                        "expr": "headroom:premium",
                        "eval_time": "5m",
                        "exp_samples": [{"labels": "headroom:premium", "value": 1.25}],
                    },
                    {
                        "expr": "headroom:standard",
                        "eval_time": "5m",
                        "exp_samples": [{"labels": "headroom:standard", "value": 1.2}],
                    },
                ],
            }
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    result = subprocess.run(
        [promtool, "test", "rules", "test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
