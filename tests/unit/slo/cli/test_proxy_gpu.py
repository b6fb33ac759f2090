"""`slo proxy --gpu` exports the node's NVML gauges as `slo serve` does: the proxy app, built
in-process from its flags with the stand-in NVML as `pynvml`, scraped on its /metrics."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from slo.cli import build_parser
from slo.cli.proxy.app import Built, build
from slo.errors import UsageError
from slo.sli import CATALOG
from tests.helpers.metric_samples import Samples, samples_of
from tests.helpers.nvml_standin import NVML_ERROR_GPU_IS_LOST, StandinGpu, StandinNvml

GIB = 2**30
MODEL = "sidecar"
UTILIZATION = CATALOG["gpu_utilization"].metric
MEMORY = CATALOG["gpu_memory"].metric
ERRORS = CATALOG["gpu_telemetry_errors"].metric


def proxy(*flags: str) -> Built:
    args = build_parser("proxy").parse_args(
        ["proxy", "--upstream", "http://127.0.0.1:1", "--model", MODEL, *flags]
    )
    return build(args, None, None, listing=("vllm", []), scrape=False)


def scrape(built: Built) -> Samples:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/metrics",
        "headers": [],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8010),
    }
    asyncio.run(built.app(scope, receive, send))
    assert sent[0]["status"] == 200, sent[0]
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return samples_of(body.decode())


def gpu_series(samples: Samples) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {key: value for key, value in samples.items() if key[0] in (UTILIZATION, MEMORY)}


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> StandinNvml:
    """The node's NVML: two GPUs, standing in for the pynvml module."""
    standin = StandinNvml(
        [
            StandinGpu(utilization_percent=64, memory_used_bytes=40 * GIB),
            StandinGpu(utilization_percent=8, memory_used_bytes=3 * GIB),
        ]
    )
    monkeypatch.setitem(sys.modules, "pynvml", standin)
    return standin


def test_slo_proxy_gpu_exports_the_nodes_gauges_and_counts_nvml_errors(
    nvml: StandinNvml,
) -> None:
    built = proxy("--gpu")
    try:
        healthy = scrape(built)
        nvml.fail("nvmlDeviceGetMemoryInfo", NVML_ERROR_GPU_IS_LOST, index=0)
        failing = scrape(built)
    finally:
        built.close()
    labels = [(("gpu", gpu), ("model", MODEL)) for gpu in "01"]
    assert gpu_series(healthy) == {
        (UTILIZATION, labels[0]): 0.64,
        (MEMORY, labels[0]): 40 * GIB,
        (UTILIZATION, labels[1]): 0.08,
        (MEMORY, labels[1]): 3 * GIB,
    }
    assert healthy[(ERRORS, (("model", MODEL),))] == 0
    assert gpu_series(failing) == {(UTILIZATION, labels[1]): 0.08, (MEMORY, labels[1]): 3 * GIB}
    assert failing[(ERRORS, (("model", MODEL),))] == 1


def test_without_gpu_the_proxy_reads_no_gpu(nvml: StandinNvml) -> None:
    built = proxy()
    try:
        samples = scrape(built)
    finally:
        built.close()
    assert gpu_series(samples) == {}
    assert samples[(ERRORS, (("model", MODEL),))] == 0
    assert nvml.calls == []


def test_gpu_without_pynvml_is_one_line_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with pytest.raises(UsageError, match=r"^--gpu reads the GPUs through NVML.*nvidia-ml-py"):
        proxy("--gpu")
