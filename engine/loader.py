"""Loading Hugging Face-format checkpoints (config.json, *.safetensors, tokenizer.json)."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import json
from pathlib import Path

import torch

from engine.architectures import SUPPORTED, generation_defaults
from engine.config import CheckpointError, ModelConfig
from engine.model import LlamaForCausalLM
from engine.safetensors_mmap import read_safetensors

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
    directory: Path,
    device: torch.device,
    dtype: torch.dtype,
    quantization: str | None = None,
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """Build the model from a checkpoint directory, its weights packed (`fuse`) for `device`.

    Shards are memory-mapped: each tensor is read once, straight into its packed (or
    quantized) form, and the mapping is released before returning, so the process ends up
    holding only the weights in the form the forward pass reads.
    """
    config = ModelConfig.from_file(directory / "config.json")
    config = _with_generation_config(config, directory)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state: dict[str, torch.Tensor] = {}
    for path in _weight_files(directory):
        state.update(read_safetensors(path))
    state = {key: value for key, value in state.items() if "rotary_emb" not in key}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    shapes = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    expected = {
        key for key in shapes if not (config.tie_word_embeddings and key == "lm_head.weight")
    }
    missing = sorted(expected - state.keys())
    unexpected = sorted(state.keys() - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"{directory}: weights do not match a {'/'.join(SUPPORTED)} model: "
            + (f"missing {missing[:3]}{'...' if len(missing) > 3 else ''} " if missing else "")
            + (
                f"unexpected {unexpected[:3]}{'...' if len(unexpected) > 3 else ''}"
                if unexpected
                else ""
            )
            + "; use a checkpoint with Hugging Face parameter names whose config.json "
            "(attention_bias, mlp_bias, model_type) says which biases it has"
        )
    for key, tensor in state.items():
        if tuple(tensor.shape) != shapes[key]:
            raise CheckpointError(
                f"{directory}: {key} has shape {tuple(tensor.shape)}, config.json implies "
                f"{shapes[key]}"
            )
    owned = {key: _owned(key, value, device, dtype) for key, value in state.items()}
    del state
    model.load_state_dict(owned, strict=False, assign=True)
    del owned
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # Buffers built on the meta device must be made real.
    from engine.model import rope_inverse_frequencies

    model.inv_freq = rope_inverse_frequencies(config).to(device)
    model.eval()
    model.fuse(quantization)
    _return_freed_memory()
    return model, config


def _owned(key: str, value: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """`value` on `device` in `dtype`, no longer backed by the file's mapping.

    The linear layers' weights may stay mapped: `fuse` copies them into their packed form
    (so a quantized model never holds them whole). Everything else is copied now, so nothing
    keeps the mapping, and its pages, alive after loading.
    """
    moved = value.to(device=device, dtype=dtype)
    if moved.data_ptr() == value.data_ptr() and not _is_linear_weight(key):
        moved = moved.clone()
    return moved


def _is_linear_weight(key: str) -> bool:
    return key.endswith("_proj.weight")  # q/k/v/o and gate/up/down: packed by `fuse`


def _with_generation_config(config: ModelConfig, directory: Path) -> ModelConfig:
    """config.json's fields plus generation_config.json's EOS ids and sampling defaults."""
    fields = generation_defaults(directory)
    eos = fields.pop("eos_token_ids", ())
    merged = tuple(dict.fromkeys((*config.eos_token_ids, *eos)))  # both stop a generation
    return dataclasses.replace(config, eos_token_ids=merged, **fields)


def _return_freed_memory() -> None:
    """Hand the float copies freed by packing back to the OS (glibc keeps them otherwise)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: its allocator decides
        ctypes.CDLL(None).malloc_trim(0)
