"""A tiny random Llama model in GGUF, for running llama.cpp (llama-cpp-python) in tests.

The weights are random (fixed seed) but shaped so that token counts can be checked exactly:

- The vocabulary is llama.cpp's SentencePiece layout: `<unk>`, `<s>`, `</s>` and the 256
  byte tokens `<0x00>`..`<0xFF>` (llama.cpp needs a byte token for every byte it may meet
  in a prompt, the newline included).
- Every token embedding carries a large constant in dimension 0 and the blocks add little
  to the residual stream, so after the final RMSNorm dimension 0 is always large and
  positive. The output row of every token that must never be generated (EOS, control
  tokens, whitespace, non-ASCII bytes) has a large negative weight there: its logit sits
  ~200 below the others, so it is never sampled whatever the temperature. Hence
  generation never stops before `max_tokens` and every generated token is one printable
  ASCII character: one token, one non-empty text chunk on the wire.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

EMBEDDING_DIM = 64
LAYERS = 2
HEADS = 4
FEED_FORWARD_DIM = 128
CONTEXT_LENGTH = 512
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
FIRST_BYTE_ID = 3
VOCAB_SIZE = FIRST_BYTE_ID + 256
# Printable ASCII without the space: each decodes to exactly one visible character.
GENERATED_BYTES = range(0x21, 0x7F)
_RESIDUAL_ANCHOR = 16.0  # dimension 0 of every embedding
_FORBIDDEN_WEIGHT = -30.0  # dimension 0 of the output row of a token never to generate


def token_id_of_byte(byte: int) -> int:
    return FIRST_BYTE_ID + byte


def write_tiny_llama(path: Path, seed: int = 0) -> Path:
    """Write the model to `path` (a few hundred KiB); return the path."""
    import gguf  # imported here: only the third-party engine tests need it

    rng = np.random.default_rng(seed)

    def small(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("llm-slo tiny random llama")
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(EMBEDDING_DIM)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FEED_FORWARD_DIM)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_dimension_count(EMBEDDING_DIM // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB_SIZE)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{byte:02X}>" for byte in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * VOCAB_SIZE)
    writer.add_token_types(types)
    writer.add_unk_token_id(UNK_ID)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    embeddings = rng.standard_normal((VOCAB_SIZE, EMBEDDING_DIM)).astype(np.float32)
    embeddings[:, 0] = _RESIDUAL_ANCHOR
    output = rng.standard_normal((VOCAB_SIZE, EMBEDDING_DIM)).astype(np.float32)
    output[:, 0] = _FORBIDDEN_WEIGHT
    output[[token_id_of_byte(byte) for byte in GENERATED_BYTES], 0] = 0.0
    ones = np.ones(EMBEDDING_DIM, dtype=np.float32)
    writer.add_tensor("token_embd.weight", embeddings)
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", output)
    for layer in range(LAYERS):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", ones)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{prefix}.{name}.weight", small(EMBEDDING_DIM, EMBEDDING_DIM))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", ones)
        writer.add_tensor(f"{prefix}.ffn_gate.weight", small(FEED_FORWARD_DIM, EMBEDDING_DIM))
        writer.add_tensor(f"{prefix}.ffn_up.weight", small(FEED_FORWARD_DIM, EMBEDDING_DIM))
        writer.add_tensor(f"{prefix}.ffn_down.weight", small(EMBEDDING_DIM, FEED_FORWARD_DIM))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _rope_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """q/k rows reordered from HF's rotate-half RoPE to llama.cpp's adjacent pairs.

    The same permutation llama.cpp's convert_hf_to_gguf.py applies: with it, both engines
    compute the same attention from the same weights.
    """
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_gguf_from_hf(checkpoint: Path, path: Path, f16: bool = True) -> Path:
    """The HF Llama checkpoint in `checkpoint` as a GGUF at `path`: the SAME weights.

    Its vocabulary is this module's SentencePiece byte layout (259 tokens), so the checkpoint
    must have `vocab_size` 259; both engines are then fed token ids, never text. Matrices are
    stored in float16 (llama.cpp's usual full precision) or float32; norms stay float32.
    """
    import json

    import gguf
    from safetensors.numpy import load_file

    config = json.loads((checkpoint / "config.json").read_text())
    if config["vocab_size"] != VOCAB_SIZE:
        raise ValueError(f"{checkpoint}: vocab_size must be {VOCAB_SIZE} to share this vocabulary")
    state: dict[str, np.ndarray] = {}
    for file in sorted(checkpoint.glob("*.safetensors")):
        state.update(load_file(str(file)))
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // heads
    matrix_type = np.float16 if f16 else np.float32

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("llm-slo random llama (same weights as the HF checkpoint)")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_vocab_size(VOCAB_SIZE)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{byte:02X}>" for byte in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * VOCAB_SIZE)
    writer.add_token_types(types + [gguf.TokenType.BYTE] * 256)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)

    def matrix(name: str) -> np.ndarray:
        return state[name].astype(np.float32).astype(matrix_type)

    def vector(name: str) -> np.ndarray:
        return state[name].astype(np.float32)

    writer.add_tensor("token_embd.weight", matrix("model.embed_tokens.weight"))
    writer.add_tensor("output_norm.weight", vector("model.norm.weight"))
    head = "model.embed_tokens.weight" if config.get("tie_word_embeddings") else "lm_head.weight"
    writer.add_tensor("output.weight", matrix(head))
    for layer in range(config["num_hidden_layers"]):
        hf, blk = f"model.layers.{layer}", f"blk.{layer}"
        writer.add_tensor(f"{blk}.attn_norm.weight", vector(f"{hf}.input_layernorm.weight"))
        q = _rope_permute(state[f"{hf}.self_attn.q_proj.weight"], heads)
        k = _rope_permute(state[f"{hf}.self_attn.k_proj.weight"], kv_heads)
        writer.add_tensor(f"{blk}.attn_q.weight", q.astype(np.float32).astype(matrix_type))
        writer.add_tensor(f"{blk}.attn_k.weight", k.astype(np.float32).astype(matrix_type))
        writer.add_tensor(f"{blk}.attn_v.weight", matrix(f"{hf}.self_attn.v_proj.weight"))
        writer.add_tensor(f"{blk}.attn_output.weight", matrix(f"{hf}.self_attn.o_proj.weight"))
        writer.add_tensor(f"{blk}.ffn_norm.weight", vector(f"{hf}.post_attention_layernorm.weight"))
        writer.add_tensor(f"{blk}.ffn_gate.weight", matrix(f"{hf}.mlp.gate_proj.weight"))
        writer.add_tensor(f"{blk}.ffn_up.weight", matrix(f"{hf}.mlp.up_proj.weight"))
        writer.add_tensor(f"{blk}.ffn_down.weight", matrix(f"{hf}.mlp.down_proj.weight"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
