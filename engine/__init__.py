"""The bundled PyTorch inference engine; this module re-exports its public names.

A Llama-style model, a paged KV cache, continuous batching with chunked prefill and tier-aware
scheduling (fifo, priority, slo), streaming, and instrumentation hooks. It knows nothing of
middleware or SLOs.
"""

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
