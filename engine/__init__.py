"""The bundled PyTorch inference engine; this module re-exports its public names.

A Llama-style model, a paged KV cache, continuous batching with chunked prefill and tier-aware
scheduling (fifo, priority, slo), streaming, and instrumentation hooks. It knows nothing of
middleware or SLOs.

Each name is imported when first used, not with the package: `engine.policies` (the policies'
names, help and flags, read by the CLI to build `slo --help`) imports without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.config import CheckpointError, EngineConfig, ModelConfig
    from engine.engine import Engine
    from engine.hooks import EngineHooks, StepStats
    from engine.outputs import (
        ColdStart,
        EngineError,
        EngineOverloaded,
        EngineStepFailed,
        EngineStopped,
        RequestOutput,
        RequestShed,
        RequestTooLarge,
    )
    from engine.sampling import SamplingParams
    from engine.stream import RequestStream

# Where each name of `__all__` lives (tests/unit/house/test_imports.py holds the two to each other).
_HOMES = {
    "CheckpointError": "engine.config",
    "EngineConfig": "engine.config",
    "ModelConfig": "engine.config",
    "Engine": "engine.engine",
    "EngineHooks": "engine.hooks",
    "StepStats": "engine.hooks",
    "ColdStart": "engine.outputs",
    "EngineError": "engine.outputs",
    "EngineOverloaded": "engine.outputs",
    "EngineStepFailed": "engine.outputs",
    "EngineStopped": "engine.outputs",
    "RequestOutput": "engine.outputs",
    "RequestShed": "engine.outputs",
    "RequestTooLarge": "engine.outputs",
    "SamplingParams": "engine.sampling",
    "RequestStream": "engine.stream",
}

__all__ = [
    "CheckpointError",
    "ColdStart",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineHooks",
    "EngineOverloaded",
    "EngineStepFailed",
    "EngineStopped",
    "ModelConfig",
    "RequestOutput",
    "RequestShed",
    "RequestStream",
    "RequestTooLarge",
    "SamplingParams",
    "StepStats",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # found by the ordinary lookup from now on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
