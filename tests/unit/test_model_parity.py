"""Our Llama matches transformers' LlamaForCausalLM on the same checkpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from engine.kv_cache import PagedKVCache  # noqa: E402
from tests.checkpoints import write_hf_llama  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hf_llama(tmp_path_factory.mktemp("hf-llama"))


def full_logits(engine: Engine, ids: list[int]) -> torch.Tensor:
    """Logits at every position of one prompt, through the paged-cache forward."""
    cache = PagedKVCache(
        engine.model_config, num_blocks=64, block_size=16, dtype=engine.dtype, device=engine.device
    )
    table: list[int] = []
    cache.ensure_capacity(table, len(ids))
    batch, positions = cache.build_batch([table], [0], [len(ids)])
    with torch.inference_mode():
        hidden = engine.model(torch.tensor([ids]), positions, cache.keys, cache.values, batch)
        return engine.model.logits(hidden)[0]


@pytest.mark.parametrize(
    "overrides",
    [{}, {"tie_word_embeddings": True}, {"num_key_value_heads": 4}, {"rope_theta": 500000.0}],
    ids=["gqa", "tied", "mha", "theta"],
)
def test_logits_match_transformers(tmp_path: Path, overrides: dict[str, object]) -> None:
    directory = write_hf_llama(tmp_path / "ckpt", seed=3, **overrides)
    reference = transformers.LlamaForCausalLM.from_pretrained(
        directory, torch_dtype=torch.float32
    ).eval()
    engine = Engine.from_pretrained(directory, EngineConfig(device="cpu", dtype="float32"))
    ids = engine.tokenizer.encode("The quick brown fox jumps over the lazy dog. ¿Qué tal?")
    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0].float()
    actual = full_logits(engine, ids)
    assert actual.shape == expected.shape
    assert torch.allclose(actual, expected, atol=1e-4, rtol=0), (actual - expected).abs().max()


def test_greedy_tokens_match_transformers_generate(checkpoint: Path) -> None:
    reference = transformers.LlamaForCausalLM.from_pretrained(
        checkpoint, torch_dtype=torch.float32
    ).eval()
    engine = Engine.from_pretrained(
        checkpoint, EngineConfig(device="cpu", dtype="float32", block_size=8)
    )
    prompts = [
        "Hello there",
        "A much longer prompt that spans several KV-cache blocks of eight tokens",
    ]
    for prompt in prompts:
        ids = engine.tokenizer.encode(prompt)
        with torch.inference_mode():
            generated = reference.generate(
                torch.tensor([ids]),
                max_new_tokens=40,
                do_sample=False,
                min_new_tokens=40,
                pad_token_id=0,
            )[0, len(ids) :].tolist()
        params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
        ours = asyncio.run(engine.complete(ids, params))
        assert list(ours.token_ids) == generated
    engine.stop_sync()


def test_bfloat16_runs_close_to_float32(checkpoint: Path) -> None:
    engine32 = Engine.from_pretrained(checkpoint, EngineConfig(device="cpu", dtype="float32"))
    engine16 = Engine.from_pretrained(checkpoint, EngineConfig(device="cpu", dtype="bfloat16"))
    assert engine16.dtype == torch.bfloat16
    ids = engine32.tokenizer.encode("bfloat16 check")
    top32 = full_logits(engine32, ids).argmax(-1)
    logits16 = full_logits(engine16, ids)
    agreement = (logits16.argmax(-1) == top32).float().mean().item()
    assert agreement >= 0.8
