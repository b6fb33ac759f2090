"""INT8 weight-only quantization: per-channel error bound, and logits close to full precision."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine import Engine, EngineConfig  # noqa: E402
from engine.kv_cache import PagedKVCache  # noqa: E402
from engine.quantize import Int8Weight, linear, linear_weight_bytes  # noqa: E402

PROMPTS = [
    "In the beginning God created the heaven and the earth.",
    "And the LORD said unto Moses,",
    "Blessed are the meek: for they shall inherit",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a king who had three sons",
    "What is the capital of France? The answer is",
]


def test_quantized_weight_error_is_half_a_step_per_channel() -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn((48, 32), generator=generator) * torch.linspace(0.01, 3.0, 48)[:, None]
    quantized = Int8Weight.quantize(weight)
    assert quantized.qweight.dtype == torch.int8 and quantized.scales.shape == (48,)
    error = (quantized.dequantize() - weight).abs()
    # Each row has its own scale: small rows are not drowned by large ones.
    assert bool((error <= quantized.scales[:, None] / 2 + 1e-7).all())
    x = torch.randn((3, 32), generator=generator)
    bias = torch.randn(48, generator=generator)
    torch.testing.assert_close(
        linear(x, quantized, bias), torch.nn.functional.linear(x, quantized.dequantize(), bias)
    )


def all_logits(engine: Engine, prompt: str) -> torch.Tensor:
    ids = engine.encode_prompt(prompt)
    cache = PagedKVCache(engine.model_config, 16, 16, engine.dtype, engine.device)
    table: list[int] = []
    cache.ensure_capacity(table, len(ids))
    batch, positions = cache.build_batch([table], [0], [len(ids)])
    with torch.inference_mode():
        tokens = torch.tensor([ids], device=engine.device)
        hidden = engine.model(tokens, positions, cache.keys, cache.values, batch)
        return engine.model.logits(hidden)[0].float().cpu()


def compare_logits(device: str) -> tuple[float, float]:
    """Top-1 agreement and mean KL(full || int8) over every position of the prompt set."""
    config = {"device": device, "dtype": "float32", "warmup": False}
    full = Engine.from_pretrained("bundled:small", EngineConfig(**config))
    int8 = Engine.from_pretrained("bundled:small", EngineConfig(quantization="int8", **config))
    assert linear_weight_bytes(int8.model) < 0.3 * linear_weight_bytes(full.model)
    agree, kl, positions = 0, 0.0, 0
    for prompt in PROMPTS:
        reference, quantized = all_logits(full, prompt), all_logits(int8, prompt)
        agree += int((reference.argmax(-1) == quantized.argmax(-1)).sum())
        log_p = torch.log_softmax(reference, -1)
        log_q = torch.log_softmax(quantized, -1)
        kl += float((log_p.exp() * (log_p - log_q)).sum())
        positions += reference.shape[0]
    return agree / positions, kl / positions


def test_int8_logits_stay_close_to_full_precision() -> None:
    top1, kl = compare_logits("cpu")
    assert top1 >= 0.95, top1
    assert kl <= 0.01, kl


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_int8_logits_stay_close_on_cuda() -> None:
    top1, kl = compare_logits("cuda")
    assert top1 >= 0.95, top1
    assert kl <= 0.01, kl
