"""The GPU gauges and NVML's failed calls on /metrics, from GPU telemetry over the stand-in
NVML: each GPU's utilization and memory by its index, the error counter born at 0 and brought
up to every failed call, and a GPU whose read failed no longer exported at its last values."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry

from engine.gpu import GpuTelemetry
from middleware import LatencyMiddleware
from middleware.config import MiddlewareConfig
from slo.sli import CATALOG
from tests.helpers.metric_samples import Samples, samples_of
from tests.helpers.nvml_standin import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_GPU_IS_LOST,
    StandinGpu,
    StandinNvml,
)

GIB = 2**30
MODEL = "m"
UTILIZATION = CATALOG["gpu_utilization"].metric
MEMORY = CATALOG["gpu_memory"].metric
ERRORS = CATALOG["gpu_telemetry_errors"].metric


async def _noop_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    raise AssertionError("/metrics is answered by the middleware")


def scrape(middleware: LatencyMiddleware) -> Samples:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/metrics", "headers": []}
    asyncio.run(middleware(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return samples_of(body.decode())


def middleware_over(nvml: StandinNvml | None) -> LatencyMiddleware:
    gpu_stats = GpuTelemetry(nvml).read if nvml is not None else None
    config = MiddlewareConfig.of(registry=CollectorRegistry(), gpu_stats=gpu_stats)
    return LatencyMiddleware(_noop_app, spec=None, store=None, model=MODEL, config=config)


def gpu_series(samples: Samples) -> dict[tuple[str, str], float]:
    """(metric, gpu index) -> value of the GPU gauges, each checked to carry the model."""
    found = {}
    for (name, labels), value in samples.items():
        if name in (UTILIZATION, MEMORY):
            assert dict(labels) == {"model": MODEL, "gpu": dict(labels)["gpu"]}, labels
            found[(name, dict(labels)["gpu"])] = value
    return found


def errors(samples: Samples) -> float:
    return samples[(ERRORS, (("model", MODEL),))]


def two_gpus() -> StandinNvml:
    return StandinNvml(
        [
            StandinGpu(utilization_percent=37, memory_used_bytes=12 * GIB),
            StandinGpu(utilization_percent=91, memory_used_bytes=70 * GIB),
        ]
    )


def test_the_error_counter_is_born_at_zero_with_or_without_gpu_telemetry() -> None:
    for nvml in (None, two_gpus()):
        middleware = middleware_over(nvml)
        try:
            assert errors(scrape(middleware)) == 0
        finally:
            middleware.close()


def test_each_gpu_is_exported_by_index_with_its_values() -> None:
    middleware = middleware_over(two_gpus())
    try:
        samples = scrape(middleware)
    finally:
        middleware.close()
    assert gpu_series(samples) == {
        (UTILIZATION, "0"): 0.37,
        (MEMORY, "0"): 12 * GIB,
        (UTILIZATION, "1"): 0.91,
        (MEMORY, "1"): 70 * GIB,
    }
    assert errors(samples) == 0


def test_a_gpu_failing_mid_way_is_counted_and_not_exported_stale() -> None:
    nvml = two_gpus()
    middleware = middleware_over(nvml)
    try:
        scrape(middleware)
        nvml.gpus[0].utilization_percent = 50
        nvml.fail("nvmlDeviceGetUtilizationRates", NVML_ERROR_GPU_IS_LOST, index=1)
        failing = [scrape(middleware), scrape(middleware)]
        nvml.heal()
        healed = scrape(middleware)
    finally:
        middleware.close()
    for samples in failing:
        assert set(gpu_series(samples)) == {(UTILIZATION, "0"), (MEMORY, "0")}
        assert gpu_series(samples)[(UTILIZATION, "0")] == 0.5
    assert [errors(samples) for samples in failing] == [1, 2]  # one failed call a scrape
    assert set(gpu_series(healed)) == {(n, g) for n in (UTILIZATION, MEMORY) for g in "01"}
    assert errors(healed) == 2


def test_an_init_failure_is_one_error_and_no_gauge() -> None:
    nvml = two_gpus()
    nvml.fail("nvmlInit", NVML_ERROR_DRIVER_NOT_LOADED)
    middleware = middleware_over(nvml)
    try:
        scrapes = [scrape(middleware) for _ in range(3)]
    finally:
        middleware.close()
    assert [errors(samples) for samples in scrapes] == [1, 1, 1]
    assert all(gpu_series(samples) == {} for samples in scrapes)
