"""Our Llama matches transformers' LlamaForCausalLM on the same checkpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from engine import SamplingParams  # noqa: E402
from engine.kv_cache import PagedKVCache  # noqa: E402
from tests.helpers.checkpoints import (  # noqa: E402
    CheckpointFactory,
    checkpoint_fixture,
    make_engine,
)
from tests.helpers.paged_logits import full_logits  # noqa: E402

checkpoint = checkpoint_fixture(seed=0)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"tie_word_embeddings": True}, {"num_key_value_heads": 4}, {"rope_theta": 500000.0}],
    ids=["gqa", "tied", "mha", "theta"],
)
def test_logits_match_transformers(
    llama_checkpoints: CheckpointFactory, overrides: dict[str, object]
) -> None:
    directory = llama_checkpoints(seed=3, **overrides)
    reference = transformers.LlamaForCausalLM.from_pretrained(
        directory, torch_dtype=torch.float32
    ).eval()
    engine = make_engine(directory)
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
    engine = make_engine(checkpoint)
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
    engine32 = make_engine(checkpoint)
    engine16 = make_engine(checkpoint, dtype="bfloat16")
    assert engine16.dtype == torch.bfloat16
    ids = engine32.tokenizer.encode("bfloat16 check")
    top32 = full_logits(engine32, ids).argmax(-1)
    logits16 = full_logits(engine16, ids)
    agreement = (logits16.argmax(-1) == top32).float().mean().item()
    assert agreement >= 0.8


def test_packed_weights_are_held_once(checkpoint: Path) -> None:
    engine = make_engine(checkpoint)
    model = engine.model
    layer = model.decoder_layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    for module, fused in (
        (attn.q_proj, attn.qkv_weight),
        (attn.v_proj, attn.qkv_weight),
        (attn.o_proj, attn.o_weight),
        (mlp.up_proj, mlp.gate_up_weight),
        (mlp.down_proj, mlp.down_weight),
    ):
        assert isinstance(fused, torch.Tensor)
        assert module.weight.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()
    # Input-major on a CPU: the transpose the matrix product reads is contiguous.
    assert isinstance(mlp.gate_up_weight, torch.Tensor)
    assert mlp.gate_up_weight.t().is_contiguous()
    # Packed once, not registered as parameters of their own: the state dict is the checkpoint's.
    assert not any("qkv" in name or "gate_up" in name for name in model.state_dict())


def test_single_sequence_decode_batch_equals_the_general_one() -> None:
    from engine.config import ModelConfig
    from tests.helpers.checkpoints import HF_TINY

    config = ModelConfig.from_dict(dict(HF_TINY))
    cache = PagedKVCache(
        config, num_blocks=32, block_size=4, dtype=torch.float32, device=torch.device("cpu")
    )
    table = [7, 3, 19, 5]
    for position in (0, 3, 4, 9, 15):
        fast, fast_positions = cache.build_batch([table], [position], [1])
        general, general_positions = cache._decode_batch([table], [position])
        assert torch.equal(fast.context_slots, general.context_slots)
        assert torch.equal(fast.slot_mapping, general.slot_mapping)
        assert torch.equal(fast_positions, general_positions)
        assert fast.mask is None and fast.token_index is None
    table.append(11)  # a new block: the kept slots are rebuilt
    fast, _ = cache.build_batch([table], [17], [1])
    assert int(fast.slot_mapping) == 11 * 4 + 1
