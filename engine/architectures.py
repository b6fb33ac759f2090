"""What each supported checkpoint family means in config.json, and what the engine refuses.

Llama, Mistral and Qwen2 share the decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU);
they differ in a few switches read here: Qwen2 has q/k/v biases and no o_proj bias, Mistral may
slide its attention window. Anything else that would change the numbers (another activation,
partial rotary embeddings, a pre-quantized checkpoint, per-layer windows) is refused with the
field's name, never silently ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.errors import CheckpointError, read_checkpoint_json

SUPPORTED = ("llama", "mistral", "qwen2")


def architecture_fields(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """The `ModelConfig` fields that depend on the family; raises on anything unsupported."""
    model_type = raw.get("model_type", "llama")
    if model_type not in SUPPORTED:
        raise CheckpointError(
            f"{source}: model_type '{model_type}' is not supported; supported: "
            f"{', '.join(SUPPORTED)} (Llama-architecture decoders)"
        )
    _refuse(raw, source, "hidden_act", "silu", "SwiGLU with silu is the only MLP implemented")
    _refuse(raw, source, "partial_rotary_factor", 1.0, "rotary embeddings cover whole heads")
    _refuse(raw, source, "pretraining_tp", 1, "set it to 1: the weights are not split")
    if raw.get("quantization_config"):
        method = raw["quantization_config"].get("quant_method", "?")
        raise CheckpointError(
            f"{source}: quantization_config ({method}) is not supported; load the full-precision "
            "checkpoint and pass quantization='int8' or 'int4' to quantize it here"
        )
    fields: dict[str, Any] = {
        "attention_bias": bool(raw.get("attention_bias", model_type == "qwen2")),
        # Llama's attention_bias covers all four projections; Qwen2 biases q, k and v only.
        "o_proj_bias": model_type != "qwen2" and bool(raw.get("attention_bias", False)),
        "mlp_bias": bool(raw.get("mlp_bias", False)),
        "sliding_window": _sliding_window(raw, source, model_type),
    }
    return fields


def _refuse(raw: dict[str, Any], source: str, key: str, supported: Any, why: str) -> None:
    value = raw.get(key)
    if value is not None and value != supported:
        raise CheckpointError(
            f"{source}: {key} {value!r} is not supported ({supported!r} is); {why}"
        )


def _sliding_window(raw: dict[str, Any], source: str, model_type: str) -> int | None:
    """Mistral's window (applied in every layer), or None when attention sees everything."""
    window = raw.get("sliding_window")
    if model_type == "qwen2":
        # Qwen2 configs carry a sliding_window that applies only with use_sliding_window, and
        # then only to layers from max_window_layers on: a per-layer mix not implemented here.
        if raw.get("use_sliding_window"):
            raise CheckpointError(
                f"{source}: use_sliding_window true is not supported for qwen2 (windows on "
                "some layers only); set it to false to attend over the whole context"
            )
        return None
    layer_types = raw.get("layer_types")
    if isinstance(layer_types, list) and len(set(layer_types)) > 1:
        raise CheckpointError(
            f"{source}: layer_types mixes {sorted(set(layer_types))}; per-layer attention kinds "
            "are not supported"
        )
    if window is None:
        return None
    if not isinstance(window, int) or window < 1:
        raise CheckpointError(f"{source}: sliding_window must be a positive integer or null")
    return window


def generation_defaults(directory: Path) -> dict[str, Any]:
    """EOS ids and default sampling from generation_config.json, as `ModelConfig` fields.

    Returns {} without the file. `do_sample: false` makes greedy the default, as in
    transformers; the request's own values still win.
    """
    path = directory / "generation_config.json"
    if not path.is_file():
        return {}
    raw = read_checkpoint_json(path)
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    fields: dict[str, Any] = {}
    eos = raw.get("eos_token_id")
    if eos is not None:
        eos_ids = eos if isinstance(eos, list) else [eos]
        if not all(isinstance(i, int) for i in eos_ids):
            raise CheckpointError(f"{path}: eos_token_id must be an integer or a list of them")
        fields["eos_token_ids"] = tuple(eos_ids)
    for key, kind, low, high in (
        ("temperature", float, 0.0, 2.0),
        ("top_p", float, 1e-9, 1.0),
        ("top_k", int, 0, None),
    ):
        value = raw.get(key)
        if value is None:
            continue
        if (
            not isinstance(value, (int, float))
            or value < low
            or (high is not None and value > high)
        ):
            raise CheckpointError(
                f"{path}: {key} {value!r} is out of range; expected a number from {low}"
                + (f" to {high}" if high is not None else "")
            )
        fields[f"default_{key}"] = kind(value)
    if raw.get("do_sample") is False:
        fields["default_temperature"] = 0.0
    return fields
