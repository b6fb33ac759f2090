"""Trains the bundled English models `bundled:small` and `bundled:small-draft`.

    python -m tools.train_bundled            # both, about 9 minutes on 2 CPU cores
    python -m tools.train_bundled --only small-draft --steps 100

Corpus: the King James Version of the Bible (1611), as shipped by the Debian package
`bible-kjv-text` and printed by the `bible` program of `bible-kjv` (`apt-get install
bible-kjv`). The KJV text is in the public domain (its copyright expired; see
/usr/share/doc/bible-kjv-text/copyright); the Debian packaging is GPL-2+, and none of it is
copied into the repository, only weights trained on it. Pass `--corpus FILE` to train on any
other UTF-8 text instead.

Both models are small Llamas with the byte-level tokenizer of `bundled:tiny` (ids 0..255 are
bytes), so no merges are learned and any text round-trips. They are trained from scratch with
the same data, schedule and seed; the draft is narrower and shallower so that proposing a token
costs a fraction of a target forward, which is what makes speculative decoding pay off. The
weights are stored as float16 (a few MB) and loaded like any Hugging Face checkpoint.

Training uses its own plain causal forward (`causal_logits`) over the engine's modules, with no
KV cache.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.loader import BUNDLED_DIR
from engine.model import LlamaForCausalLM
from tools.bundled_models import write_byte_tokenizer

BOS, EOS = 256, 257


def _llama_config(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 258,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "torch_dtype": "float16",
    }


@dataclass(frozen=True)
class TrainPlan:
    name: str
    config: dict
    steps: int
    batch_size: int = 8
    context: int = 256
    learning_rate: float = 4e-3
    warmup_steps: int = 40


PLANS = {
    "small": TrainPlan("small", _llama_config(160, 448, 4, 5, 1), steps=550),
    "small-draft": TrainPlan("small-draft", _llama_config(128, 384, 1, 4, 1), steps=800),
}


def read_kjv() -> str:
    """The KJV as flowing text: one chapter per line, verse numbers and headings dropped."""
    if shutil.which("bible") is None:
        raise SystemExit(
            "the corpus comes from Debian's bible-kjv-text package: run "
            "`apt-get install bible-kjv` (or pass --corpus FILE with any UTF-8 text)"
        )
    raw = subprocess.run(
        ["bible", "gen1:1-rev22:21"], capture_output=True, text=True, check=True
    ).stdout
    chapters: list[list[str]] = []
    for line in raw.splitlines():
        if not line.strip():
            continue
        if re.fullmatch(r"[1-3]?\s?[A-Z][A-Za-z ]+ \d+", line.strip()):
            chapters.append([])  # a "Genesis 1" heading starts a chapter
            continue
        verse = re.match(r"\s+\d+ (.*)", line)
        if verse:
            chapters[-1].append(verse.group(1))
        elif chapters and chapters[-1]:
            chapters[-1][-1] += " " + line.strip()  # a wrapped verse continues
    return "\n".join(" ".join(verses) for verses in chapters if verses) + "\n"


def causal_logits(model: LlamaForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    """Plain training forward over the engine's modules (same math as the paged forward)."""
    config = model.config
    bsz, seq_len = ids.shape
    heads, kv_heads, head_dim = (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    )
    half = head_dim // 2
    hidden = model.model.embed_tokens(ids)
    cos, sin = model.rope(torch.arange(seq_len).unsqueeze(0), hidden.dtype)
    eps = config.rms_norm_eps

    def rotate(x: torch.Tensor) -> torch.Tensor:
        return x * cos + torch.roll(x, half, dims=-1) * sin

    for layer in model.decoder_layers:
        attn, mlp = layer.self_attn, layer.mlp
        normed = F.rms_norm(hidden, (hidden.shape[-1],), layer.input_layernorm.weight, eps)
        q = rotate(attn.q_proj(normed).view(bsz, seq_len, heads, head_dim))
        k = rotate(attn.k_proj(normed).view(bsz, seq_len, kv_heads, head_dim))
        v = attn.v_proj(normed).view(bsz, seq_len, kv_heads, head_dim)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            is_causal=True,
            enable_gqa=heads != kv_heads,
        )
        hidden = hidden + attn.o_proj(out.transpose(1, 2).reshape(bsz, seq_len, -1))
        normed = F.rms_norm(hidden, (hidden.shape[-1],), layer.post_attention_layernorm.weight, eps)
        hidden = hidden + mlp.down_proj(F.silu(mlp.gate_proj(normed)) * mlp.up_proj(normed))
    hidden = F.rms_norm(hidden, (hidden.shape[-1],), model.model.norm.weight, eps)
    return model.lm_head(hidden)


def init_model(config: dict, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(ModelConfig.from_dict(config))
    for name, parameter in model.named_parameters():
        if name.endswith("norm.weight"):
            torch.nn.init.ones_(parameter)
        elif name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
            # GPT-2's residual scaling: keeps the residual stream's variance flat with depth.
            std = 0.02 / math.sqrt(2 * config["num_hidden_layers"])
            torch.nn.init.normal_(parameter, 0.0, std)
        else:
            torch.nn.init.normal_(parameter, 0.0, 0.02)
    return model


def train(
    plan: TrainPlan, data: torch.Tensor, val: torch.Tensor, seed: int = 0
) -> LlamaForCausalLM:
    model = init_model(plan.config, seed)
    params = sum(p.numel() for p in model.parameters())
    print(f"{plan.name}: {params / 1e6:.2f}M parameters, {plan.steps} steps", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=plan.learning_rate,
        betas=(0.9, 0.95),
    )
    generator = torch.Generator().manual_seed(seed)
    started = time.perf_counter()
    for step in range(plan.steps):
        # Linear warm-up, then cosine decay to a tenth of the peak.
        if step < plan.warmup_steps:
            lr = plan.learning_rate * (step + 1) / plan.warmup_steps
        else:
            progress = (step - plan.warmup_steps) / max(1, plan.steps - plan.warmup_steps)
            lr = plan.learning_rate * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        starts = torch.randint(
            0, len(data) - plan.context - 1, (plan.batch_size,), generator=generator
        )
        batch = torch.stack([data[s : s + plan.context + 1] for s in starts.tolist()])
        logits = causal_logits(model, batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 50 == 0 or step == plan.steps - 1:
            print(
                f"  step {step:4d}  loss {loss.item():.3f}  {time.perf_counter() - started:6.1f}s",
                flush=True,
            )
    model.eval()
    print(f"  validation loss {evaluate(model, val, plan.context):.3f} nats/byte", flush=True)
    return model


@torch.no_grad()
def evaluate(model: LlamaForCausalLM, val: torch.Tensor, context: int, batches: int = 8) -> float:
    usable = (len(val) - 1) // context
    rows = torch.arange(min(usable, batches * 8)) * context
    losses = []
    for chunk in rows.split(8):
        batch = torch.stack([val[s : s + context + 1] for s in chunk.tolist()])
        logits = causal_logits(model, batch[:, :-1])
        losses.append(F.cross_entropy(logits.reshape(-1, 258), batch[:, 1:].reshape(-1)).item())
    return sum(losses) / len(losses)


def save(model: LlamaForCausalLM, plan: TrainPlan, directory: Path) -> None:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(plan.config, indent=2) + "\n")
    state = {
        name: tensor.detach().to(torch.float16).contiguous()
        for name, tensor in model.state_dict().items()
        if name != "lm_head.weight"  # tied to the embedding
    }
    save_file(state, str(directory / "model.safetensors"))
    write_byte_tokenizer(directory)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, help="UTF-8 text file (default: the KJV)")
    parser.add_argument("--only", choices=list(PLANS), action="append")
    parser.add_argument("--steps", type=int, help="override the number of steps")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=BUNDLED_DIR)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    text = args.corpus.read_text() if args.corpus else read_kjv()
    encoded = torch.tensor(list(text.encode("utf-8")), dtype=torch.long)
    split = int(len(encoded) * 0.98)
    data, val = encoded[:split], encoded[split:]
    print(f"corpus: {len(encoded) / 1e6:.2f}M bytes", flush=True)
    started = time.perf_counter()
    for name in args.only or list(PLANS):
        plan = PLANS[name]
        if args.steps:
            plan = TrainPlan(**{**plan.__dict__, "steps": args.steps})
        model = train(plan, data, val)
        save(model, plan, args.out / name)
        print(f"  wrote {args.out / name}", flush=True)
    print(f"trained in {time.perf_counter() - started:.0f}s", flush=True)


if __name__ == "__main__":
    main()
