"""GPU telemetry (`engine.gpu`) over the stand-in NVML, on a CPU: the devices read with their
values, failures counted and named (nvmlInit, a call failing mid-way), and the stand-in held
to pynvml's own interface."""

from __future__ import annotations

import inspect
import sys
from typing import Any

import pytest

from engine.gpu import GpuTelemetry, load_pynvml
from tests.conftest import require_or_skip
from tests.helpers.nvml_standin import (
    CALLS,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_UNKNOWN,
    StandinGpu,
    StandinNvml,
)

GIB = 2**30


def three_gpus() -> StandinNvml:
    return StandinNvml(
        [
            StandinGpu("NVIDIA H100 80GB HBM3", 37, memory_used_bytes=12 * GIB),
            StandinGpu("NVIDIA H100 80GB HBM3", 91, memory_used_bytes=70 * GIB),
            StandinGpu("NVIDIA L4", 5, memory_used_bytes=GIB, memory_total_bytes=24 * GIB),
        ]
    )


def test_the_standin_has_pynvmls_calls_and_parameters() -> None:
    pynvml = load_pynvml()
    if pynvml is None:
        require_or_skip("pynvml is not installed (pip install -e '.[engine]')")
    assert issubclass(pynvml.NVMLError, Exception)
    for call in CALLS:
        real = inspect.signature(getattr(pynvml, call))
        ours = inspect.signature(getattr(StandinNvml(), call))
        assert list(ours.parameters) == list(real.parameters), call


def test_every_device_is_read_with_its_values() -> None:
    nvml = three_gpus()
    reading = GpuTelemetry(nvml).read()
    assert (reading.errors, reading.last_error) == (0, None)
    assert [
        (d.index, d.name, d.utilization_percent, d.memory_used_bytes, d.memory_total_bytes)
        for d in reading.devices
    ] == [
        (index, gpu.name, gpu.utilization_percent, gpu.memory_used_bytes, gpu.memory_total_bytes)
        for index, gpu in enumerate(nvml.gpus)
    ]
    assert nvml.calls[0] == "nvmlInit"


def test_an_init_failure_is_counted_once_and_nothing_is_read() -> None:
    nvml = three_gpus()
    nvml.fail("nvmlInit", NVML_ERROR_LIBRARY_NOT_FOUND)
    telemetry = GpuTelemetry(nvml)
    for _ in range(3):
        reading = telemetry.read()
        assert reading.devices == ()
        assert reading.errors == 1
    assert reading.last_error == "nvmlInit: NVML Shared Library Not Found"
    assert nvml.calls == ["nvmlInit"]  # tried once, not at every scrape
    assert not telemetry.available


def test_a_gpu_failing_mid_way_is_left_out_and_counted() -> None:
    """GPU 1 falls off the bus for one read: the others are still read, then it comes back."""
    nvml = three_gpus()
    telemetry = GpuTelemetry(nvml)
    nvml.fail("nvmlDeviceGetHandleByIndex", NVML_ERROR_GPU_IS_LOST, index=1, times=1)
    failed = telemetry.read()
    assert [d.index for d in failed.devices] == [0, 2]
    assert failed.errors == 1
    assert failed.last_error == "GPU 1: nvmlDeviceGetHandleByIndex: GPU is lost"
    healed = telemetry.read()
    assert [d.index for d in healed.devices] == [0, 1, 2]
    assert healed.errors == 1  # a running total


@pytest.mark.parametrize(
    "call", ["nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetName"]
)
def test_each_device_call_failing_is_counted_by_name(call: str) -> None:
    nvml = three_gpus()
    nvml.fail(call, NVML_ERROR_UNKNOWN, index=2)
    telemetry = GpuTelemetry(nvml)
    for reads in (1, 2):
        reading = telemetry.read()
        assert [d.index for d in reading.devices] == [0, 1]
        assert reading.errors == reads
    assert reading.last_error == f"GPU 2: {call}: Unknown Error"


def test_a_failed_count_reads_no_device() -> None:
    nvml = three_gpus()
    nvml.fail("nvmlDeviceGetCount", NVML_ERROR_UNKNOWN, times=1)
    telemetry = GpuTelemetry(nvml)
    failed = telemetry.read()
    assert (failed.devices, failed.errors) == ((), 1)
    assert failed.last_error == "nvmlDeviceGetCount: Unknown Error"
    again = telemetry.read()
    assert (len(again.devices), again.errors) == (3, 1)


def test_without_pynvml_there_is_nothing_to_read_or_count() -> None:
    reading = GpuTelemetry(None).read()
    assert (reading.devices, reading.errors) == ((), 0)


def test_the_standin_stands_for_pynvml_in_sys_modules(monkeypatch: Any) -> None:
    nvml = three_gpus()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert load_pynvml() is nvml
    assert len(GpuTelemetry(load_pynvml()).read().devices) == 3
