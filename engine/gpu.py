"""GPU telemetry through NVML: utilization and memory per device; empty without NVIDIA drivers."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class GpuStats:
    index: int
    name: str
    utilization_percent: float
    memory_used_bytes: int
    memory_total_bytes: int


_lock = threading.Lock()
_nvml: Any = None
_nvml_failed = False


def _load_nvml() -> Any:
    global _nvml, _nvml_failed
    with _lock:
        if _nvml is not None or _nvml_failed:
            return _nvml
        try:
            import pynvml

            pynvml.nvmlInit()
            _nvml = pynvml
        except Exception:  # no library, no driver, no device: telemetry is simply absent
            _nvml_failed = True
        return _nvml


def read_gpu_stats() -> list[GpuStats]:
    """One entry per visible NVIDIA device; [] on machines without NVML."""
    nvml = _load_nvml()
    if nvml is None:
        return []
    stats = []
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
            name = nvml.nvmlDeviceGetName(handle)
            stats.append(
                GpuStats(
                    index=index,
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    utilization_percent=float(utilization.gpu),
                    memory_used_bytes=int(memory.used),
                    memory_total_bytes=int(memory.total),
                )
            )
    except Exception:
        return []
    return stats
