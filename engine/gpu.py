"""GPU telemetry through NVML: utilization and memory per device, and the NVML calls that failed.

`GpuTelemetry` reads NVML through a module with pynvml's interface: `pynvml` (nvidia-ml-py)
when it is installed (`load_pynvml`), or a stand-in in tests (tests/helpers/nvml_standin.py).
NVML is initialised once, at the first read. A reading holds every device that could be read;
a device whose call fails is left out of that reading, not reported at its last values. Every
failed NVML call is counted, `nvmlInit` included (no driver, no library: counted once, and
nothing is read after), with the last error's text: the middleware exports the count as
`llm_slo_gpu_telemetry_errors_total`. Without pynvml there is nothing to read and nothing is
counted. The engine knows nothing of metrics: this module only counts.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("engine.gpu")


@dataclass(frozen=True, slots=True)
class GpuStats:
    index: int
    name: str
    utilization_percent: float
    memory_used_bytes: int
    memory_total_bytes: int


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One read of every device: those read, and the failed calls so far (a running total)."""

    devices: tuple[GpuStats, ...]
    errors: int
    last_error: str | None = None


def load_pynvml() -> Any | None:
    """The `pynvml` module (nvidia-ml-py), None when it is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class GpuTelemetry:
    """Reads of the GPUs through `nvml` (a module with pynvml's interface; None: nothing to
    read), safe from several threads."""

    def __init__(self, nvml: Any | None) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()
        self._initialised = False
        self._init_failed = False
        self.errors = 0
        self.last_error: str | None = None

    @property
    def available(self) -> bool:
        """Whether there is an NVML to read (it may still fail to initialise)."""
        return self._nvml is not None and not self._init_failed

    def read(self) -> GpuReading:
        with self._lock:
            nvml = self._ready()
            devices = self._devices(nvml) if nvml is not None else ()
            return GpuReading(devices, self.errors, self.last_error)

    def _ready(self) -> Any | None:
        """The NVML module once initialised; None when there is none or its init failed."""
        if self._nvml is None or self._init_failed:
            return None
        if not self._initialised:
            try:
                _call(self._nvml, "nvmlInit")
            except NvmlCallFailed as failed:
                self._init_failed = True
                # A machine without a GPU lands here: info, not a warning, and counted once.
                self._failed(failed, "no GPU telemetry from this process", logging.INFO)
                return None
            self._initialised = True
        return self._nvml

    def _devices(self, nvml: Any) -> tuple[GpuStats, ...]:
        try:
            count = int(_call(nvml, "nvmlDeviceGetCount"))
        except NvmlCallFailed as failed:
            self._failed(failed, "no GPU in this reading")
            return ()
        devices = []
        for index in range(count):
            try:
                devices.append(_read_device(nvml, index))
            except NvmlCallFailed as failed:
                self._failed(failed, "left out of this reading")
        return tuple(devices)

    def _failed(
        self, failed: NvmlCallFailed, consequence: str, level: int = logging.WARNING
    ) -> None:
        message = str(failed)
        if message != self.last_error:  # once per new error, not at every scrape
            logger.log(level, "NVML: %s; %s (counted)", message, consequence)
        self.errors += 1
        self.last_error = message


class NvmlCallFailed(Exception):
    """An NVML call that raised: which call, on which GPU, and NVML's error."""

    def __init__(self, function: str, gpu: int | None, error: Exception) -> None:
        where = f"GPU {gpu}: " if gpu is not None else ""
        super().__init__(f"{where}{function}: {error}")


def _call(nvml: Any, function: str, *args: Any, gpu: int | None = None) -> Any:
    """`nvml.<function>(*args)`; whatever it raises (an NVMLError, or a binding without the
    function) comes back as NvmlCallFailed naming the call, never through the scrape."""
    try:
        return getattr(nvml, function)(*args)
    except Exception as error:
        raise NvmlCallFailed(function, gpu, error) from error


def _read_device(nvml: Any, index: int) -> GpuStats:
    handle = _call(nvml, "nvmlDeviceGetHandleByIndex", index, gpu=index)
    memory = _call(nvml, "nvmlDeviceGetMemoryInfo", handle, gpu=index)
    utilization = _call(nvml, "nvmlDeviceGetUtilizationRates", handle, gpu=index)
    name = _call(nvml, "nvmlDeviceGetName", handle, gpu=index)
    return GpuStats(
        index=index,
        name=name.decode() if isinstance(name, bytes) else str(name),
        utilization_percent=float(utilization.gpu),
        memory_used_bytes=int(memory.used),
        memory_total_bytes=int(memory.total),
    )


_default: GpuTelemetry | None = None
_default_lock = threading.Lock()


def read_gpu_stats() -> GpuReading:
    """A reading of this process's GPUs through pynvml (one telemetry per process)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = GpuTelemetry(load_pynvml())
    return _default.read()
