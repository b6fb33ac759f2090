"""Writes the bundled checkpoints (`python -m tools.bundled_models`).

`bundled:tiny` is a small random-weight Llama with a byte-level tokenizer: deterministic (fixed
seed), a few hundred kilobytes, and loaded through the same Hugging Face-format path as any
user checkpoint. Its text is not meant to be readable; it exists so the engine runs with
nothing downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.loader import BUNDLED_DIR

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 258,
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 256,
    "eos_token_id": 257,
    "torch_dtype": "float32",
}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character for every byte (what ByteLevel tokenizers use)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {byte: chr(code) for byte, code in zip(printable, codes, strict=True)}


def write_byte_tokenizer(directory: Path) -> None:
    """A tokenizer.json whose ids 0..255 are the bytes themselves, plus <s> and </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    mapping = _bytes_to_unicode()
    tokenizer = Tokenizer(models.BPE(vocab={mapping[b]: b for b in range(256)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<s>", "</s>"])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 256)]
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "model_max_length": 1024}, indent=2)
        + "\n"
    )


def random_llama_state(config: dict[str, object], seed: int) -> dict[str, torch.Tensor]:
    from engine.config import ModelConfig
    from engine.model import LlamaForCausalLM

    generator = torch.Generator().manual_seed(seed)
    model = LlamaForCausalLM(ModelConfig.from_dict(dict(config)))
    state = {}
    for name, tensor in model.state_dict().items():
        if name.endswith("norm.weight"):
            state[name] = torch.ones_like(tensor)
        else:
            state[name] = torch.randn(tensor.shape, generator=generator) * 0.1
    return state


def write_tiny(directory: Path = BUNDLED_DIR / "tiny", seed: int = 1234) -> Path:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(TINY_CONFIG, indent=2) + "\n")
    save_file(random_llama_state(TINY_CONFIG, seed), str(directory / "model.safetensors"))
    write_byte_tokenizer(directory)
    return directory


if __name__ == "__main__":
    print(f"wrote {write_tiny()}")
