"""Tiny random Llama checkpoints written by `transformers`, the reference the engine must match."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
