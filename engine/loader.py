"""Loading Hugging Face-format checkpoints (config.json, *.safetensors, tokenizer.json)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.config import CheckpointError, ModelConfig
from engine.model import LlamaForCausalLM

BUNDLED_PREFIX = "bundled:"
BUNDLED_DIR = Path(__file__).parent / "bundled"

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_checkpoint(name_or_path: str | Path) -> Path:
    """`bundled:NAME` -> the shipped checkpoint directory; anything else is a local directory."""
    text = str(name_or_path)
    if text.startswith(BUNDLED_PREFIX):
        name = text[len(BUNDLED_PREFIX) :]
        directory = BUNDLED_DIR / name
        if not (directory / "config.json").is_file():
            available = sorted(
                p.name for p in BUNDLED_DIR.iterdir() if (p / "config.json").is_file()
            )
            raise CheckpointError(
                f"unknown bundled model '{text}'; available: "
                + ", ".join(f"bundled:{n}" for n in available)
            )
        return directory
    directory = Path(text).expanduser()
    if not directory.is_dir():
        raise CheckpointError(
            f"model '{text}' is neither a bundled model (bundled:tiny) nor a directory; "
            "pass a folder holding config.json, *.safetensors and tokenizer.json"
        )
    return directory


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CheckpointError(f"device '{device}' requested but CUDA is not available; use cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise CheckpointError(
            f"dtype '{dtype}' is not supported; use one of: auto, {', '.join(DTYPES)}"
        )
    return DTYPES[dtype]


def _weight_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return sorted({directory / name for name in weight_map.values()})
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(
            f"{directory}: no *.safetensors weights found; save the model with "
            "`model.save_pretrained(dir, safe_serialization=True)`"
        )
    return files


def load_model(
    directory: Path, device: torch.device, dtype: torch.dtype
) -> tuple[LlamaForCausalLM, ModelConfig]:
    from safetensors.torch import load_file

    config = ModelConfig.from_file(directory / "config.json")
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state: dict[str, torch.Tensor] = {}
    for path in _weight_files(directory):
        state.update(load_file(str(path), device="cpu"))
    state = {key: value for key, value in state.items() if "rotary_emb" not in key}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = {
        key
        for key in model.state_dict()
        if not (config.tie_word_embeddings and key == "lm_head.weight")
    }
    missing = sorted(expected - state.keys())
    unexpected = sorted(state.keys() - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"{directory}: weights do not match a Llama model: "
            + (f"missing {missing[:3]}{'...' if len(missing) > 3 else ''} " if missing else "")
            + (
                f"unexpected {unexpected[:3]}{'...' if len(unexpected) > 3 else ''}"
                if unexpected
                else ""
            )
            + "; use a checkpoint with Hugging Face Llama parameter names"
        )
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(model.state_dict()[key].shape):
            raise CheckpointError(
                f"{directory}: {key} has shape {tuple(tensor.shape)}, config.json implies "
                f"{tuple(model.state_dict()[key].shape)}"
            )
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # Buffers built on the meta device must be made real.
    from engine.model import rope_inverse_frequencies

    model.inv_freq = rope_inverse_frequencies(config)
    model.to(device)
    model.eval()
    model.fuse()
    return model, config
