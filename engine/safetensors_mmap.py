"""Reading a `.safetensors` file as tensors over a memory map: nothing is read until used.

`safetensors.torch.load_file` copies every tensor into fresh memory first, so a model is held
twice while it is packed. Here each tensor is a view of the mapped file; the pages it touches
are read on demand, and the mapping goes away with the last tensor that uses it.
"""

from __future__ import annotations

import json
import mmap
from pathlib import Path

import torch

from engine.config import CheckpointError

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the file, each a view of one private (copy-on-write) mapping."""
    with path.open("rb") as handle:
        size = path.stat().st_size
        if size < 8:
            raise CheckpointError(f"{path}: too short to be a safetensors file")
        # Copy-on-write, so the tensors are writable as torch expects; nothing writes to them.
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    header_size = int.from_bytes(mapped[:8], "little")
    if 8 + header_size > size:
        raise CheckpointError(f"{path}: header size {header_size} runs past the end of the file")
    try:
        header = json.loads(mapped[8 : 8 + header_size])
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: the safetensors header is not JSON: {error}") from error
    base = 8 + header_size
    tensors: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise CheckpointError(
                f"{path}: tensor {name} has dtype {info.get('dtype')!r}; supported: "
                + ", ".join(_DTYPES)
            )
        shape = tuple(info["shape"])
        start, end = info["data_offsets"]
        count = end - start
        if base + end > size or count != _numel(shape) * dtype.itemsize:
            raise CheckpointError(f"{path}: tensor {name}'s data offsets do not fit its shape")
        if count == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(
            mapped, dtype=dtype, count=count // dtype.itemsize, offset=base + start
        )
        tensors[name] = flat.view(shape)
    return tensors


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total
