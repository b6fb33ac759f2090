"""The logits our engine computes at every position of one prompt, through the paged-cache
forward: what the parity tests hold against transformers and llama.cpp.

Needs torch: import this after `pytest.importorskip("torch")`.
"""

from __future__ import annotations

import torch

from engine import Engine
from engine.kv_cache import PagedKVCache


def full_logits(engine: Engine, ids: list[int]) -> torch.Tensor:
    """Logits at every position of one prompt, through the paged-cache forward."""
    cache = PagedKVCache(
        engine.model_config, num_blocks=64, block_size=16, dtype=engine.dtype, device=engine.device
    )
    table: list[int] = []
    cache.ensure_capacity(table, len(ids))
    batch, positions = cache.build_batch([table], [0], [len(ids)])
    with torch.inference_mode():
        hidden = engine.model(torch.tensor([ids]), positions, cache.keys, cache.values, batch)
        return engine.model.logits(hidden)[0]
