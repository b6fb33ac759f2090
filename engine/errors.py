"""Errors of loading a model that say what to fix, and the reader of a checkpoint's JSON files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded; the message says what to fix."""


def read_checkpoint_json(path: Path) -> Any:
    """The JSON value in `path` (config.json, generation_config.json, tokenizer_config.json);
    a `CheckpointError` naming the line where it is not JSON. A missing file raises
    FileNotFoundError: each caller says what its absence means."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{path}:{error.lineno}: invalid JSON: {error.msg}") from error
