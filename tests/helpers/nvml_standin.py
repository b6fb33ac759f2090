"""A stand-in NVML library with pynvml's interface (nvidia-ml-py), for GPU telemetry on a CPU.

`StandinNvml` answers the calls `engine.gpu` makes, and a few more a reader of GPUs makes
(power, temperature, shutdown), with pynvml's names, arguments and return shapes: handles
from `nvmlDeviceGetHandleByIndex`, `nvmlMemory_t`-like `total/free/used` in bytes,
`nvmlUtilization_t`-like `gpu/memory` in percent, the name as `str`, power in milliwatts.
Calls before `nvmlInit` raise NVMLError(NVML_ERROR_UNINITIALIZED), as NVML does.

It is scriptable to fail: `fail("nvmlInit", NVML_ERROR_LIBRARY_NOT_FOUND)` (a machine without
the driver), `fail("nvmlDeviceGetHandleByIndex", NVML_ERROR_GPU_IS_LOST, index=1)` (a GPU
that fell off the bus), for every call or the next `times` ones. Hand it to
`engine.gpu.GpuTelemetry(standin)`, or put it in `sys.modules["pynvml"]` for code that
imports pynvml itself. `tests/unit/engine/test_gpu.py` checks these names and parameters
against the real pynvml where it is installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_TEMPERATURE_GPU = 0
# NVML's own text for each code (pynvml's NVMLError.__str__).
ERROR_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """pynvml's error: `value` is NVML's return code, `str()` its text."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return ERROR_STRINGS.get(self.value, f"NVML Error with code {self.value}")


@dataclass
class StandinGpu:
    """One device as NVML reports it."""

    name: str = "NVIDIA H100 80GB HBM3"
    utilization_percent: int = 0
    memory_utilization_percent: int = 0
    memory_used_bytes: int = 0
    memory_total_bytes: int = 80 * 2**30
    power_milliwatts: int = 70_000
    temperature_c: int = 35


@dataclass(frozen=True)
class _Handle:
    index: int


@dataclass
class _Failure:
    code: int
    index: int | None
    times: int | None  # None: every call


@dataclass
class StandinNvml:
    """NVML over `gpus`, failing where `fail` says; `calls` lists every call made, by name."""

    gpus: list[StandinGpu] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    initialised: bool = False
    _failures: dict[str, list[_Failure]] = field(default_factory=dict)

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU

    def fail(
        self, call: str, code: int, *, index: int | None = None, times: int | None = None
    ) -> None:
        """Make `call` raise NVMLError(code): for GPU `index` only (None: any), the next
        `times` calls (None: every one)."""
        if not callable(getattr(self, call, None)):
            raise AttributeError(f"the stand-in has no NVML call {call!r}")
        self._failures.setdefault(call, []).append(_Failure(code, index, times))

    def heal(self) -> None:
        """No call fails any more."""
        self._failures.clear()

    def _enter(self, call: str, index: int | None = None, needs_init: bool = True) -> None:
        self.calls.append(call)
        for failure in self._failures.get(call, []):
            if failure.times == 0 or failure.index not in (None, index):
                continue
            if failure.times is not None:
                failure.times -= 1
            raise NVMLError(failure.code)
        if needs_init and not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _gpu(self, call: str, handle: Any) -> StandinGpu:
        if not isinstance(handle, _Handle) or handle.index >= len(self.gpus):
            self._enter(call)
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self._enter(call, handle.index)
        return self.gpus[handle.index]

    def nvmlInit(self) -> None:
        self._enter("nvmlInit", needs_init=False)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex", index)
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        free = gpu.memory_total_bytes - gpu.memory_used_bytes
        return SimpleNamespace(total=gpu.memory_total_bytes, free=free, used=gpu.memory_used_bytes)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=gpu.utilization_percent, memory=gpu.memory_utilization_percent)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_milliwatts

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return self._gpu("nvmlDeviceGetTemperature", handle).temperature_c


# The NVML calls the stand-in answers: the interface test compares them with pynvml's.
CALLS = tuple(
    name
    for name in vars(StandinNvml)
    if name.startswith("nvml") and callable(vars(StandinNvml)[name])
)
