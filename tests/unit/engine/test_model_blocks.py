"""Each block of engine/model.py computes its textbook math, on bundled:tiny's weights.

`RMSNorm.forward`, `MLP.forward`, `Attention.forward` and `DecoderLayer.forward` are held to
plain reimplementations written here from the checkpoint's own linear modules (Hugging Face's
formulas: rsqrt norm, rotate_half RoPE, softmax over causal scores), not the packed weights
and shortcuts the blocks run on. Attention is checked through every way a forward's tokens
reach it: one sequence's prefill and decode, a padded batch of two, and their batched decode.
The fast path is held to the blocks too: a fused step (decodes and prefill chunks in one
ragged forward) gives the logits the layer-by-layer padded forward gives.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from engine.attention import LayerInputs, PaddedAttention  # noqa: E402
from engine.chunked import prefill_chunks  # noqa: E402
from engine.fused import fused_forward  # noqa: E402
from engine.kv_cache import PagedKVCache  # noqa: E402
from engine.model import Attention, DecoderLayer, LlamaForCausalLM, RMSNorm  # noqa: E402
from engine.runner import decode  # noqa: E402
from engine.sequence import Sequence  # noqa: E402

TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    config = EngineConfig(device="cpu", dtype="float32", warmup=False, block_size=4)
    engine = Engine.from_pretrained("bundled:tiny", config)
    yield engine
    engine.stop_sync()


@pytest.fixture
def model(engine: Engine) -> LlamaForCausalLM:
    return engine.model


def new_cache(model: LlamaForCausalLM) -> PagedKVCache:
    return PagedKVCache(
        model.config, num_blocks=32, block_size=4, dtype=torch.float32, device=torch.device("cpu")
    )


# ------------------------------------------------------------------ the textbook formulas
def norm_reference(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight


def rope_reference(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x [tokens, heads, D] rotated as Hugging Face does (`rotate_half`)."""
    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2).float() / dim)
    angles = torch.cat((positions.float()[:, None] * inv_freq,) * 2, -1)[:, None]
    half = dim // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), -1)
    return x * angles.cos() + rotated * angles.sin()


def attention_reference(
    attn: Attention, model: LlamaForCausalLM, x: torch.Tensor, residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One sequence's tokens at positions 0..T-1, causal: residual + o_proj(attention), and
    the rotated keys and the values each position caches [T, kv_heads, D]."""
    config = model.config
    tokens, heads, kv_heads, dim = len(x), attn.num_heads, attn.num_kv_heads, attn.head_dim
    positions = torch.arange(tokens)
    q = rope_reference(attn.q_proj(x).view(tokens, heads, dim), positions, config.rope_theta)
    k = rope_reference(attn.k_proj(x).view(tokens, kv_heads, dim), positions, config.rope_theta)
    v = attn.v_proj(x).view(tokens, kv_heads, dim)
    group = heads // kv_heads
    scores = torch.einsum("qhd,khd->hqk", q, k.repeat_interleave(group, 1)) / math.sqrt(dim)
    causal = torch.ones(tokens, tokens, dtype=torch.bool).tril()
    weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    out = torch.einsum("hqk,khd->qhd", weights, v.repeat_interleave(group, 1))
    return residual + attn.o_proj(out.reshape(tokens, heads * dim)), k, v


def layer_inputs(
    model: LlamaForCausalLM,
    cache: PagedKVCache,
    tables: list[list[int]],
    starts: list[int],
    counts: list[int],
) -> LayerInputs:
    """What a layer reads for a [B, T] batch adding `counts[i]` tokens at `starts[i]`."""
    batch, positions = cache.build_batch(tables, starts, counts)
    cos, sin = model.rope(positions, torch.float32, batch.context_slots.shape[1] - 1)
    return LayerInputs(cos, sin, PaddedAttention.of(batch, positions, model.config))


# ------------------------------------------------------------------------------ the blocks
def test_the_norm_is_rmsnorm(model: LlamaForCausalLM) -> None:
    torch.manual_seed(0)
    x = torch.randn(5, model.config.hidden_size) * 3
    for norm in (model.decoder_layers[1].post_attention_layernorm, model.model.norm):
        torch.testing.assert_close(norm.forward(x), norm_reference(norm, x), **TOLERANCE)


def test_the_mlp_is_swiglu_added_to_the_residual(model: LlamaForCausalLM) -> None:
    torch.manual_seed(1)
    x, residual = torch.randn(2, 5, model.config.hidden_size).unbind()
    mlp = model.decoder_layers[0].mlp
    expected = residual + mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    torch.testing.assert_close(mlp.forward(x, residual), expected, **TOLERANCE)


@torch.inference_mode()
def test_attention_is_causal_rope_attention_prefilling_then_decoding(
    model: LlamaForCausalLM,
) -> None:
    torch.manual_seed(2)
    attn, cache = model.decoder_layers[1].self_attn, new_cache(model)
    x, residual = torch.randn(2, 11, model.config.hidden_size).unbind()
    expected, keys, values = attention_reference(attn, model, x, residual)
    table: list[int] = []
    cache.ensure_capacity(table, 11)
    layer_caches = cache.keys[1], cache.values[1]
    prefill = layer_inputs(model, cache, [table], [0], [10])
    torch.testing.assert_close(
        attn.forward(x[:10], residual[:10], prefill, *layer_caches), expected[:10], **TOLERANCE
    )
    one = layer_inputs(model, cache, [table], [10], [1])  # reads the prefill's keys back
    torch.testing.assert_close(
        attn.forward(x[10:], residual[10:], one, *layer_caches), expected[10:], **TOLERANCE
    )
    slots = cache.table_slots(table)[:11]
    torch.testing.assert_close(cache.keys[1][slots], keys, **TOLERANCE)
    torch.testing.assert_close(cache.values[1][slots], values, **TOLERANCE)


@torch.inference_mode()
def test_attention_over_a_padded_batch_and_its_batched_decode(model: LlamaForCausalLM) -> None:
    torch.manual_seed(3)
    attn, cache = model.decoder_layers[0].self_attn, new_cache(model)
    lengths = [6, 13]  # each prefills all but its last token in one padded batch, then decodes
    hidden = model.config.hidden_size
    inputs = [torch.randn(2, length, hidden).unbind() for length in lengths]
    tables: list[list[int]] = [[], []]
    for table, length in zip(tables, lengths, strict=True):
        cache.ensure_capacity(table, length)
    width = max(lengths) - 1
    padded = torch.zeros(2, 2, width, hidden)  # (x, residual) per row, zeros past each prompt
    for row, ((x, residual), length) in enumerate(zip(inputs, lengths, strict=True)):
        padded[0, row, : length - 1], padded[1, row, : length - 1] = x[:-1], residual[:-1]
    prefill = layer_inputs(model, cache, tables, [0, 0], [n - 1 for n in lengths])
    out = attn.forward(*padded.view(2, -1, hidden), prefill, cache.keys[0], cache.values[0])
    last = torch.stack([x[-1] for x, _ in inputs]), torch.stack([r[-1] for _, r in inputs])
    step = layer_inputs(model, cache, tables, [n - 1 for n in lengths], [1, 1])
    decoded = attn.forward(*last, step, cache.keys[0], cache.values[0])
    for row, ((x, residual), length) in enumerate(zip(inputs, lengths, strict=True)):
        expected, _, _ = attention_reference(attn, model, x, residual)
        got = out.view(2, width, hidden)[row, : length - 1]
        torch.testing.assert_close(got, expected[:-1], **TOLERANCE)
        torch.testing.assert_close(decoded[row], expected[-1], **TOLERANCE)


@torch.inference_mode()
def test_a_layer_is_attention_then_the_mlp_each_over_its_norm(model: LlamaForCausalLM) -> None:
    torch.manual_seed(4)
    layer: DecoderLayer = model.decoder_layers[0]
    cache = new_cache(model)
    h = torch.randn(9, model.config.hidden_size)
    attended, _, _ = attention_reference(
        layer.self_attn, model, norm_reference(layer.input_layernorm, h), h
    )
    normed = norm_reference(layer.post_attention_layernorm, attended)
    mlp = layer.mlp
    expected = attended + mlp.down_proj(F.silu(mlp.gate_proj(normed)) * mlp.up_proj(normed))
    table: list[int] = []
    cache.ensure_capacity(table, 9)
    inputs = layer_inputs(model, cache, [table], [0], [9])
    out = layer.forward(h, inputs, cache.keys[0], cache.values[0])
    torch.testing.assert_close(out, expected, **TOLERANCE)


# ----------------------------------------------------------------- the fast path, the same
def sequence(engine: Engine, name: str, prompt: str) -> Sequence:
    made = Sequence(
        request_id=name,
        prompt_ids=engine.encode_prompt(prompt),
        params=SamplingParams(max_tokens=4, temperature=0),
        priority=0,
        arrival=0,
        detokenizer=None,  # type: ignore[arg-type]  # never detokenized here
        deliver=lambda _: None,
    )
    engine.worker.cache.ensure_capacity(made.block_table, made.num_tokens + 2)
    return made


@torch.inference_mode()
def test_a_fused_step_gives_the_padded_forwards_logits(engine: Engine) -> None:
    """Two decodes, a chunk in the middle of its prompt and one that ends it, in one ragged
    forward: the decodes' and the ending chunk's logits are the padded passes'."""
    model, cache = engine.model, engine.worker.cache
    decodes = [sequence(engine, "short", "In the"), sequence(engine, "long", "And God said " * 3)]
    prefill_chunks(model, cache, decodes, [s.num_tokens for s in decodes])
    for decoding in decodes:
        decoding.output_ids.append(101)
    middle, ending = sequence(engine, "middle", "x y z " * 8), sequence(engine, "end", "Let there")
    prefill_chunks(model, cache, [middle, ending], [12, 4])
    cached = [s.num_cached for s in (*decodes, middle, ending)]
    expected_decodes = decode(model, cache, decodes)
    expected_chunks = prefill_chunks(model, cache, [middle, ending], [7, ending.num_tokens - 4])
    for computed, count in zip((*decodes, middle, ending), cached, strict=True):
        computed.num_cached = count  # as before the padded passes: computed again, fused
        written = cache.table_slots(computed.block_table)[count : computed.num_tokens]
        for layer in (*cache.keys, *cache.values):  # the fused step must write them again
            layer[written] = 0
    chunks = [(middle, 7), (ending, ending.num_tokens - 4)]
    fused_decodes, fused_chunks = fused_forward(chunks)(model, cache, [*decodes, middle, ending])
    torch.testing.assert_close(fused_decodes, expected_decodes, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fused_chunks[1], expected_chunks[1], rtol=1e-4, atol=1e-4)
    assert fused_decodes.argmax(-1).tolist() == expected_decodes.argmax(-1).tolist()
