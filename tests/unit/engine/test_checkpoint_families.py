"""Qwen2 and Mistral checkpoints written by transformers load and match it; the checkpoint's
chat_template.jinja and generation_config.json are honoured; unsupported fields are named."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from engine.config import CheckpointError  # noqa: E402
from tests.helpers.checkpoints import HF_TINY, write_hf_llama  # noqa: E402
from tests.helpers.paged_logits import full_logits  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."
FAMILIES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    # A window of 8 keys: the prompt (80 tokens) and the generation run far past it.
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 8}),
}


def write_family(directory: Path, family: str, seed: int = 5) -> Path:
    """A random transformers checkpoint of `family` with the byte-level test tokenizer."""
    from tools.bundled_models import write_byte_tokenizer

    config_name, model_name, extra = FAMILIES[family]
    torch.manual_seed(seed)
    config = getattr(transformers, config_name)(**{**HF_TINY, **extra})
    model = getattr(transformers, model_name)(config).eval()
    with torch.no_grad():  # wider than the default init, so logits are far from uniform
        for name, parameter in model.named_parameters():
            if not name.endswith("norm.weight"):
                parameter.normal_(0.0, 0.1)
    model.save_pretrained(directory, safe_serialization=True)
    write_byte_tokenizer(directory)
    return directory


def reference_model(directory: Path, family: str) -> Any:
    cls = getattr(transformers, FAMILIES[family][1])
    # Eager attention: the reference applies the sliding window by its own mask code.
    return cls.from_pretrained(
        directory, torch_dtype=torch.float32, attn_implementation="eager"
    ).eval()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_logits_and_greedy_tokens_match_transformers(tmp_path: Path, family: str) -> None:
    directory = write_family(tmp_path / family, family)
    raw = json.loads((directory / "config.json").read_text())
    assert raw["model_type"] == family
    reference = reference_model(directory, family)
    if family == "qwen2":
        assert reference.model.layers[0].self_attn.q_proj.bias is not None
        assert reference.model.layers[0].self_attn.o_proj.bias is None
    engine = Engine.from_pretrained(directory, EngineConfig(device="cpu", dtype="float32"))
    ids = engine.tokenizer.encode(PROMPT)
    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0]
    actual = full_logits(engine, ids)
    assert torch.allclose(actual, expected, atol=1e-4, rtol=0), (actual - expected).abs().max()
    # Decoding one token at a time over the paged cache (the window applied step by step).
    with torch.inference_mode():
        generated = reference.generate(
            torch.tensor([ids[:12]]),
            max_new_tokens=24,
            min_new_tokens=24,
            do_sample=False,
            pad_token_id=0,
        )[0, 12:].tolist()
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    ours = asyncio.run(engine.complete(ids[:12], params))
    engine.stop_sync()
    assert list(ours.token_ids) == generated


def test_without_the_window_mistral_logits_differ(tmp_path: Path) -> None:
    """The window matters for this prompt: ignoring it (the old behaviour) gives other logits."""
    directory = write_family(tmp_path / "mistral", "mistral")
    windowed = Engine.from_pretrained(directory, EngineConfig(device="cpu", dtype="float32"))
    config = json.loads((directory / "config.json").read_text())
    config["sliding_window"] = None
    (directory / "config.json").write_text(json.dumps(config))
    full = Engine.from_pretrained(directory, EngineConfig(device="cpu", dtype="float32"))
    ids = windowed.tokenizer.encode(PROMPT)
    difference = (full_logits(windowed, ids) - full_logits(full, ids)).abs()
    assert float(difference[:8].max()) < 1e-5  # inside the window both see the same keys
    assert float(difference[8:].max()) > 1e-2


def test_chat_template_file_and_generation_config_are_read(tmp_path: Path) -> None:
    directory = write_hf_llama(tmp_path / "ckpt")
    (directory / "chat_template.jinja").write_text(
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant] "
    )
    generation = json.loads((directory / "generation_config.json").read_text())
    generation.update(eos_token_id=[257, 42], temperature=0.6, top_p=0.9, top_k=20)
    (directory / "generation_config.json").write_text(json.dumps(generation))
    engine = Engine.from_pretrained(directory, EngineConfig(device="cpu", warmup=False))
    text = engine.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "[user] hi\n[assistant] "
    assert {257, 42} <= set(engine.model_config.eos_token_ids)
    assert 42 in engine.tokenizer.eos_token_ids
    # A request that leaves sampling unset gets the checkpoint's defaults; its own values win.
    from engine.api.schema import _sampling

    unset = _sampling({"prompt": "x"}, engine, 1, None)
    assert (unset.temperature, unset.top_p, unset.top_k) == (0.6, 0.9, 20)
    chosen = _sampling({"prompt": "x", "temperature": 0, "top_k": 3}, engine, 1, None)
    assert (chosen.temperature, chosen.top_k) == (0, 3)


def test_safetensors_are_mapped_then_released(tmp_path: Path) -> None:
    """Loading reads through a mapping of the file, and no tensor keeps it mapped afterwards."""
    directory = write_hf_llama(tmp_path / "ckpt")
    weights = str(directory / "model.safetensors")
    engine = Engine.from_pretrained(directory, EngineConfig(device="cpu", warmup=False))
    assert engine.model.fused  # loaded and packed
    maps = Path("/proc/self/maps")
    if maps.is_file():
        assert weights not in maps.read_text()


@pytest.mark.parametrize(
    "change, field",
    [
        ({"model_type": "gemma"}, "model_type 'gemma'"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5"),
        ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config (gptq)"),
        ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window"),
        ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
        ({"sliding_window": 0}, "sliding_window"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "rope_scaling type 'yarn'"),
    ],
)
def test_unsupported_fields_are_refused_by_name(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    directory = write_hf_llama(tmp_path / "ckpt")
    config = json.loads((directory / "config.json").read_text())
    config.update(change)
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config\.json") as raised:
        Engine.from_pretrained(directory, EngineConfig(device="cpu", warmup=False))
    assert field in str(raised.value)
