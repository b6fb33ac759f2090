"""Tiny random Llama checkpoints written by `transformers`, the reference the engine must match,
and the engine the unit tests run on them.

One factory writes them: the session fixture `llama_checkpoints` (registered in
tests/conftest.py) writes each (seed, config) once a session; a module asks for its own with
`checkpoint = checkpoint_fixture(seed=7)`. `make_engine` is the one way a test builds an engine on
one of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from engine import Engine

CheckpointFactory = Callable[..., Path]

HF_TINY = dict(
    vocab_size=258,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    bos_token_id=256,
    eos_token_id=257,
    tie_word_embeddings=False,
)


def write_hf_llama(directory: Path, seed: int = 0, **overrides: Any) -> Path:
    """Save a randomly initialized `LlamaForCausalLM` and a byte-level tokenizer.json."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tools.bundled_models import write_byte_tokenizer

    torch.manual_seed(seed)
    config = LlamaConfig(**{**HF_TINY, **overrides})
    model = LlamaForCausalLM(config).eval()
    # Default init is tiny (std 0.02): widen it so logits are not near-uniform and ties rare.
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if not name.endswith("norm.weight"):
                parameter.normal_(0.0, 0.1)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    write_byte_tokenizer(directory)
    return directory


@pytest.fixture(scope="session")
def llama_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> CheckpointFactory:
    """`llama_checkpoints(seed, **overrides)`: the folder of a checkpoint written by
    `write_hf_llama`, once a session for each seed and config. Tests read it, never write it."""
    written: dict[str, Path] = {}

    def checkpoint(seed: int = 0, **overrides: Any) -> Path:
        key = json.dumps([seed, overrides], sort_keys=True)
        if key not in written:
            folder = tmp_path_factory.mktemp(f"hf-llama-seed{seed}")
            written[key] = write_hf_llama(folder, seed, **overrides)
        return written[key]

    return checkpoint


def checkpoint_fixture(seed: int = 0, name: str = "checkpoint", **overrides: Any) -> Any:
    """A module-scoped fixture `name` giving the checkpoint of `seed` and `overrides` (the
    config fields of HF_TINY to change): `checkpoint = checkpoint_fixture(seed=7)`."""

    @pytest.fixture(scope="module", name=name)
    def fixture(llama_checkpoints: CheckpointFactory) -> Path:
        return llama_checkpoints(seed, **overrides)

    return fixture


def make_engine(checkpoint: Path, **config: Any) -> Engine:
    """The engine on `checkpoint` as the unit tests run it: on the CPU, in float32 (exact
    against transformers and against itself), 8-token KV blocks (so short prompts span several);
    `config` sets or overrides any `EngineConfig` field."""
    from engine import Engine, EngineConfig

    options: dict[str, Any] = {"device": "cpu", "dtype": "float32", "block_size": 8, **config}
    return Engine.from_pretrained(checkpoint, EngineConfig(**options))
