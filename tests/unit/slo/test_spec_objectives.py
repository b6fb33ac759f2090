"""Tiers from the Gateway API Inference Extension's objective header: the gateway tags a
request with its InferenceObjective's name (`x-gateway-inference-objective`), and the tier whose
objective names hold it is the request's; the header is configurable, or off; each tier's
generated InferenceObjective gets its priority from the tier order."""

from __future__ import annotations

import pytest
import yaml

from alerts.kubernetes import Workload, inference_objectives, objective_priorities
from slo.errors import SpecError
from slo.spec import OBJECTIVE_HEADER, SLOSpec

SPEC = """
version: 1
tiers:
  - name: batch_jobs
    priority: 5
    match: {header: x-llm-tier, values: [batch]}
    objectives: [p99 e2e <= 20s]
  - name: chat
    priority: 0
    match: {objectives: [chat-premium, chat-gold]}
    objectives: [p95 ttft <= 200ms]
  - name: standard
    priority: 1
    default: true
    objectives: [p95 ttft <= 500ms]
"""


def test_the_objective_header_names_the_tier() -> None:
    spec = SLOSpec.from_yaml(SPEC)
    assert OBJECTIVE_HEADER == "x-gateway-inference-objective"
    by = {
        name: spec.resolve_tier({OBJECTIVE_HEADER: name}, "/v1/chat").name
        for name in ("chat-premium", "chat-gold", "batch-jobs", "standard", "unknown")
    }
    assert by == {
        "chat-premium": "chat",
        "chat-gold": "chat",
        "batch-jobs": "batch_jobs",  # a tier's own name, as a Kubernetes name, by default
        "standard": "standard",
        "unknown": "standard",  # the default tier
    }
    # The header's name is matched case-insensitively, its value trimmed; the tier's own
    # header still works beside it.
    assert spec.resolve_tier({"X-Gateway-Inference-Objective": " chat-gold "}, "/").name == "chat"
    assert spec.resolve_tier({"x-llm-tier": "batch"}, "/").name == "batch_jobs"


def test_the_objective_header_is_configurable_and_can_be_off() -> None:
    renamed = SLOSpec.from_yaml(SPEC + "objective_header: X-Objective\n")
    assert renamed.resolve_tier({"x-objective": "chat-gold"}, "/").name == "chat"
    assert renamed.resolve_tier({OBJECTIVE_HEADER: "chat-gold"}, "/").name == "standard"
    off = SLOSpec.from_yaml(SPEC + "objective_header: null\n")
    assert off.resolve_tier({OBJECTIVE_HEADER: "chat-gold"}, "/").name == "standard"
    normalized = yaml.safe_dump(renamed.to_dict())
    assert SLOSpec.from_yaml(normalized).objective_header == "x-objective"


def test_a_bad_objective_header_is_one_line_naming_it() -> None:
    with pytest.raises(SpecError, match="objective_header 3 must be a header name"):
        SLOSpec.from_yaml(SPEC + "objective_header: 3\n")


def test_each_tier_gets_an_inference_objective_with_its_priority_from_the_order() -> None:
    spec = SLOSpec.from_yaml(SPEC)
    # chat (priority 0) is served first, then standard (1), then batch_jobs (5): the
    # InferenceObjective's priority is the higher the more critical.
    assert objective_priorities(spec) == {"chat": 2, "standard": 1, "batch_jobs": 0}
    objectives = inference_objectives(spec, Workload(deployment="vllm", inference_pool="pool"))
    assert [(o["metadata"]["name"], o["spec"]["priority"]) for o in objectives] == [
        ("batch-jobs", 0),
        ("chat-premium", 2),
        ("standard", 1),
    ]
    assert {o["spec"]["poolRef"]["name"] for o in objectives} == {"pool"}
    for objective in objectives:  # the header the gateway sets for it resolves to the tier
        name, tier = objective["metadata"]["name"], objective["metadata"]["labels"]["llm-slo/tier"]
        assert spec.resolve_tier({OBJECTIVE_HEADER: name}, "/").name == tier
