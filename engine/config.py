"""Model and engine configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.architectures import architecture_fields
from engine.errors import CheckpointError, read_checkpoint_json
from engine.policies import DEFAULT_POLICY, POLICY_NAMES

__all__ = ["CheckpointError", "EngineConfig", "ModelConfig"]


@dataclass(frozen=True)
class ModelConfig:
    """The subset of a Hugging Face Llama `config.json` the engine needs."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str = "float32"
    # Checkpoint families (engine/architectures.py) and generation_config.json defaults.
    o_proj_bias: bool = False  # Llama's attention_bias; Qwen2 biases q/k/v only
    sliding_window: int | None = None  # Mistral: each query sees this many latest keys
    default_temperature: float = 1.0  # for requests that do not set it
    default_top_p: float = 1.0
    default_top_k: int = 0

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> ModelConfig:
        required = (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
        )
        missing = [key for key in required if key not in raw]
        if missing:
            raise CheckpointError(
                f"{source}: missing {', '.join(missing)}; a Llama-style config.json needs "
                f"{', '.join(required)}"
            )

        family = architecture_fields(raw, source)
        heads = int(raw["num_attention_heads"])
        kv_heads = int(raw.get("num_key_value_heads") or heads)
        if heads % kv_heads:
            raise CheckpointError(
                f"{source}: num_attention_heads ({heads}) must be a multiple of "
                f"num_key_value_heads ({kv_heads})"
            )
        head_dim = int(raw.get("head_dim") or int(raw["hidden_size"]) // heads)
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        rope_scaling = raw.get("rope_scaling")
        rope_theta = raw.get("rope_theta")
        if rope_theta is None and isinstance(raw.get("rope_parameters"), dict):
            rope_theta = raw["rope_parameters"].get("rope_theta")
            if raw["rope_parameters"].get("rope_type", "default") != "default":
                rope_scaling = raw["rope_parameters"]
        return cls(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            **family,
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
        )

    @classmethod
    def from_file(cls, path: Path) -> ModelConfig:
        try:
            raw = read_checkpoint_json(path)
        except FileNotFoundError as error:
            raise CheckpointError(
                f"{path}: not found; a checkpoint directory needs config.json"
            ) from error
        if not isinstance(raw, dict):
            raise CheckpointError(f"{path}: expected a JSON object")
        return cls.from_dict(raw, source=str(path))


@dataclass
class EngineConfig:
    """How the engine runs: device, precision, KV-cache size and scheduling limits."""

    device: str = "auto"  # "auto" picks CUDA when present, else CPU
    dtype: str = "auto"  # "auto": bfloat16 on CUDA, float32 on CPU
    block_size: int = 16  # tokens per KV-cache block
    num_kv_blocks: int | None = None  # None: sized from kv_cache_bytes
    kv_cache_bytes: int = 256 * 1024 * 1024
    max_batch_size: int = 64  # running sequences decoded together
    max_prefill_tokens: int = 4096  # prefill token budget per step
    max_waiting: int = 256  # bounded waiting queue; beyond it generate() raises EngineOverloaded
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    max_tokens_cap: int | None = None  # upper bound for max_tokens; default: max_model_len
    seed: int = 0  # seeds the generator of sampled requests that bring no seed
    warmup: bool = True
    # Intra-op threads of the engine's worker thread on a CPU. None: one fewer than the cores,
    # so the event loop serving HTTP keeps a core; sharing all of them makes torch's threads
    # wait on each other at every op (oversubscription) and roughly doubles a decode step.
    cpu_threads: int | None = None
    step_delay_s: float = 0.0  # sleep added to every step: for alert drills and fault tests
    # Share full KV blocks across requests with the same token prefix (system prompts, turns).
    enable_prefix_caching: bool = False
    # Speculative decoding: a small model with the same tokenizer proposes
    # `num_speculative_tokens` tokens per step; the target verifies them in one forward.
    draft_model: str | None = None  # "bundled:small-draft" or a checkpoint directory
    num_speculative_tokens: int = 4
    quantization: str | None = None  # "int8"/"int4": weight-only linear layers (target and draft)
    # torch.compile the decode forward (engine/compiled.py): faster decode steps for a one-time
    # compile during warm-up (tens of seconds on a CPU, cached on disk by inductor after that).
    compile: bool = False
    # Tier isolation (engine/policies/, engine/scheduler.py). Tokens one step computes: every
    # running decode first, prefill chunks fill the rest, so a long prompt spans several steps
    # instead of stalling the decodes. None: max_prefill_tokens.
    max_num_batched_tokens: int | None = None
    # A step that decodes and prefills runs them in one forward pass (engine/fused.py); False:
    # two passes, the chunks then the decodes (for comparison; speculative decoding always).
    fuse_steps: bool = True
    # The scheduler records who made each request wait (engine/blame.py, docs/blame.md),
    # handed over with its last hook event (`on_blame`); False: nothing is recorded.
    blame: bool = True
    scheduling: str = DEFAULT_POLICY  # one of engine.policies.POLICY_NAMES
    # Why `scheduling` was chosen, shown in /health (`slo serve`: the spec's objectives or the
    # flag); None: this default.
    scheduling_reason: str | None = None
    priority_aging_s: float | None = 2.0  # waiting this long moves a request up one level
    # For a policy that reads objectives (`slo`): each priority's (TTFT, TPOT) objective
    # thresholds in seconds (None: no objective); `slo serve` fills it from the spec's tiers.
    tier_objectives: dict[int, tuple[float | None, float | None]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.quantization not in (None, "int8", "int4"):
            raise ValueError(
                f"EngineConfig.quantization is {self.quantization!r}; use None, 'int8' or 'int4'"
            )
        if self.scheduling not in POLICY_NAMES:
            names = [repr(name) for name in POLICY_NAMES]
            raise ValueError(
                f"EngineConfig.scheduling is {self.scheduling!r}; "
                f"use {', '.join(names[:-1])} or {names[-1]}"
            )
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(
                "EngineConfig.max_num_batched_tokens must be at least 1, "
                f"got {self.max_num_batched_tokens}"
            )
        if self.draft_model is not None and self.num_speculative_tokens < 1:
            raise ValueError(
                "EngineConfig.num_speculative_tokens must be at least 1 with a draft_model, "
                f"got {self.num_speculative_tokens}"
            )
