"""Weight formats (bf16 prepacked, int8, int4): the kernels' products, memory, and logits close to
float32 on a trained model (top-1 agreement and KL per format)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine import Engine, EngineConfig  # noqa: E402
from engine.kv_cache import PagedKVCache  # noqa: E402
from engine.quantize import Int4Weight, Int8Weight, linear, linear_add, linear_weight_bytes  # noqa: E402
from engine.weights import MkldnnWeight, cpu_has_bf16_kernels  # noqa: E402

PROMPTS = [
    "In the beginning God created the heaven and the earth.",
    "And the LORD said unto Moses,",
    "Blessed are the meek: for they shall inherit",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a king who had three sons",
    "What is the capital of France? The answer is",
]
# (engine options, least top-1 agreement, largest mean KL(fp32 || format)) per format.
FORMATS = {
    "bfloat16": ({"dtype": "bfloat16"}, 0.95, 0.002),
    "int8": ({"dtype": "float32", "quantization": "int8"}, 0.97, 0.001),
    "int8-bf16": ({"dtype": "bfloat16", "quantization": "int8"}, 0.95, 0.002),
    "int4": ({"dtype": "float32", "quantization": "int4"}, 0.9, 0.02),
}


def close_in_bf16(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal up to bfloat16 activations (8 bits of mantissa) relative to the output's size."""
    scale = float(expected.abs().max())
    torch.testing.assert_close(actual.float(), expected.float(), rtol=0, atol=0.02 * scale)


def test_int8_weight_error_is_half_a_step_per_channel() -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn((48, 32), generator=generator) * torch.linspace(0.01, 3.0, 48)[:, None]
    quantized = Int8Weight.quantize(weight)
    assert quantized.qweight.dtype == torch.int8 and quantized.scales.shape == (48,)
    error = (quantized.dequantize() - weight).abs()
    # Each row has its own scale: small rows are not drowned by large ones.
    assert bool((error <= quantized.scales.float()[:, None] / 2 + 1e-6).all())
    x = torch.randn((3, 32), generator=generator)
    bias = torch.randn(48, generator=generator)
    reference = torch.nn.functional.linear(x, quantized.dequantize(), bias)
    out = linear(x, quantized, bias)
    assert out.dtype == torch.float32  # the kernel's bf16 stays inside the product
    close_in_bf16(out, reference)
    residual = torch.randn((3, 48), generator=generator)
    close_in_bf16(linear_add(residual, x, quantized, bias), residual + reference)


def test_int4_product_matches_its_dequantized_weight() -> None:
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn((32, 128), generator=generator)
    quantized = Int4Weight.quantize(weight, group_size=32)
    assert quantized.nbytes < weight.nbytes / 6  # 4 bits a weight plus a scale/zero per 32
    # Dequantize through the kernel itself: the identity matrix picks out every column.
    dequantized = quantized.matmul(torch.eye(128)).t()
    step = (weight.view(32, 4, 32).amax(-1) - weight.view(32, 4, 32).amin(-1)) / 15
    error = (dequantized - weight).abs().view(32, 4, 32)
    assert bool((error <= step[..., None] * 0.5 + 0.02).all())  # half a step, bf16 scales
    x = torch.randn((5, 128), generator=generator)
    close_in_bf16(linear(x, quantized), x @ dequantized.t())
    with pytest.raises(ValueError, match="groups of 32"):
        Int4Weight.quantize(torch.randn(16, 48), group_size=32)


@pytest.mark.skipif(not cpu_has_bf16_kernels(), reason="this CPU has no bf16 instructions")
def test_prepacked_bf16_product_and_fused_add() -> None:
    generator = torch.Generator().manual_seed(2)
    weight = torch.randn((40, 24), generator=generator).bfloat16()
    packed = MkldnnWeight.pack(weight)
    x = torch.randn((3, 24), generator=generator).bfloat16()
    bias = torch.randn(40, generator=generator).bfloat16()
    residual = torch.randn((3, 40), generator=generator).bfloat16()
    reference = torch.nn.functional.linear(x.float(), weight.float(), bias.float())
    close_in_bf16(linear(x, packed, bias), reference)
    close_in_bf16(linear_add(residual, x, packed, bias), residual.float() + reference)


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


@pytest.fixture(scope="module")
def reference() -> Engine:
    config = EngineConfig(device="cpu", dtype="float32", warmup=False)
    return Engine.from_pretrained("bundled:small", config)


def compare_logits(full: Engine, other: Engine) -> tuple[float, float]:
    """Top-1 agreement and mean KL(full || other) over every position of the prompt set."""
    agree, kl, positions = 0, 0.0, 0
    for prompt in PROMPTS:
        expected, actual = all_logits(full, prompt), all_logits(other, prompt)
        agree += int((expected.argmax(-1) == actual.argmax(-1)).sum())
        log_p = torch.log_softmax(expected, -1)
        log_q = torch.log_softmax(actual, -1)
        kl += float((log_p.exp() * (log_p - log_q)).sum())
        positions += expected.shape[0]
    return agree / positions, kl / positions


@pytest.mark.parametrize("name", list(FORMATS))
def test_format_logits_stay_close_to_float32(reference: Engine, name: str) -> None:
    options, least_top1, most_kl = FORMATS[name]
    engine = Engine.from_pretrained(
        "bundled:small", EngineConfig(device="cpu", warmup=False, **options)
    )
    top1, kl = compare_logits(reference, engine)
    assert top1 >= least_top1, (name, top1)
    assert kl <= most_kl, (name, kl)


@pytest.mark.parametrize("quantization, most", [("int8", 0.27), ("int4", 0.2)])
def test_quantized_model_holds_no_float_copy(
    reference: Engine, quantization: str, most: float
) -> None:
    config = EngineConfig(device="cpu", dtype="float32", warmup=False, quantization=quantization)
    engine = Engine.from_pretrained("bundled:small", config)
    model = engine.model
    assert linear_weight_bytes(model) <= most * linear_weight_bytes(reference.model)
    # The modules' float weights are placeholders without memory, not views of a packed copy.
    for layer in model.decoder_layers:
        for module in (layer.self_attn.q_proj, layer.self_attn.o_proj, layer.mlp.down_proj):
            assert module.weight.is_meta
    held = sum(p.nbytes for p in model.parameters() if not p.is_meta)
    # What is left in float32: the embedding (tied LM head, also quantized) and the norms.
    assert held <= model.model.embed_tokens.weight.nbytes * 1.05
    with pytest.raises(RuntimeError, match="load the checkpoint again"):
        model.fuse()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_quantized_logits_stay_close_on_cuda(quantization: str) -> None:
    options = {"device": "cuda", "dtype": "bfloat16", "warmup": False}
    full = Engine.from_pretrained("bundled:small", EngineConfig(**options))
    quantized = Engine.from_pretrained(
        "bundled:small", EngineConfig(quantization=quantization, **options)
    )
    top1, kl = compare_logits(full, quantized)
    assert top1 >= FORMATS[quantization][1], top1
    assert kl <= FORMATS[quantization][2], kl
