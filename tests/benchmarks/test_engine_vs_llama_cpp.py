"""The bundled engine against llama.cpp (llama-cpp-python) on the SAME random weights, same run.

    python -m pytest tests/benchmarks/test_engine_vs_llama_cpp.py -o addopts="" -s \
        -p no:cacheprovider

A random Llama checkpoint is written by transformers, and the same weights as a float16 GGUF
(tests/helpers/gguf_model.py, q/k permuted for llama.cpp's RoPE), so both engines compute the
same function: their logits are compared first. Then, one thread each:

- batch 1: 64 greedy tokens after a 16-token prompt, per weight format of ours against
  llama.cpp's f16; rounds alternate between the two and the ratio is the median of per-round
  ratios (load from other processes on a shared machine comes and goes, and hits both alike).
  Each format also runs with `compile=True` (engine/compiled.py: the decode forward compiled
  by inductor; a format whose kernel does not trace prints why and runs eagerly).
  Goal: the format named for each shape in JUDGED, chosen before measuring (from the runs the
  README reports: int4 compiled at 5M, 1.14-1.18x; int4 at 75M, 2.32x), at least llama.cpp's
  (at 5M parameters a step is per-op overhead more than bytes read: the compiled forms are
  the ones that pay). The other formats are measured and printed, not judged: taking the best
  of eight after the fact would pass on the luck of one noisy format;
- 16 concurrent requests through continuous batching with the judged format, aggregate
  tokens/s, against llama.cpp's single stream (its Python server runs one request at a time).
  Goal: at least 2x;
- resident memory of the model: each format loaded in a fresh process, RSS after one
  generation minus RSS before loading (torch and the engine imported). Goal: int8 at most
  0.35x of float32's.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
llama_cpp = pytest.importorskip("llama_cpp")
pytest.importorskip("gguf")

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from tests.helpers.checkpoints import write_hf_llama  # noqa: E402
from tests.helpers.gguf_model import BOS_ID, EOS_ID, VOCAB_SIZE, write_gguf_from_hf  # noqa: E402

NEW_TOKENS = 64
CONCURRENT = 16
ROUNDS = 3
PROMPT_IDS = [BOS_ID, *range(40, 55)]
SHAPES = {
    "5M": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8),
    "75M": dict(
        hidden_size=1024, intermediate_size=2304, num_hidden_layers=8, num_attention_heads=16
    ),
}
WEIGHT_FORMATS: dict[str, dict[str, Any]] = {
    "float32": {"dtype": "float32"},
    "bfloat16": {"dtype": "bfloat16"},
    "int8": {"dtype": "bfloat16", "quantization": "int8"},
    "int4": {"dtype": "bfloat16", "quantization": "int4"},
}
FORMATS = {
    **WEIGHT_FORMATS,
    **{f"{fmt}+compile": {**options, "compile": True} for fmt, options in WEIGHT_FORMATS.items()},
}
# The format judged against llama.cpp at each shape, named before anything is measured.
JUDGED = {"5M": "int4+compile", "75M": "int4"}
assert set(JUDGED) == set(SHAPES) and set(JUDGED.values()) <= set(FORMATS)


@pytest.fixture(scope="module", params=list(SHAPES))
def shape(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    name = request.param
    directory = write_hf_llama(
        tmp_path_factory.mktemp(f"bench-{name}"),
        seed=11,
        vocab_size=VOCAB_SIZE,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        num_key_value_heads=SHAPES[name]["num_attention_heads"] // 4,
        max_position_embeddings=1024,
        **SHAPES[name],
    )
    gguf_path = write_gguf_from_hf(directory, directory / "model-f16.gguf")
    return name, directory, gguf_path


def load_llama_cpp(path: Path) -> Any:
    return llama_cpp.Llama(
        str(path), n_threads=1, n_threads_batch=1, n_ctx=512, verbose=False, logits_all=True
    )


def llama_cpp_round(llm: Any) -> float:
    """Seconds for the prompt and NEW_TOKENS greedy tokens."""
    llm.reset()
    started = time.perf_counter()
    for count, _ in enumerate(llm.generate(PROMPT_IDS, top_k=1, temp=0.0, reset=True), 1):
        if count == NEW_TOKENS:
            break
    return time.perf_counter() - started


def load_engine(directory: Path, options: dict[str, Any]) -> Engine:
    config = EngineConfig(device="cpu", cpu_threads=1, num_kv_blocks=256, **options)
    engine = Engine.from_pretrained(directory, config)
    engine.start_sync()
    return engine


def engine_round(engine: Engine, requests: int = 1) -> float:
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)

    async def run() -> None:
        outs = await asyncio.gather(
            *(engine.complete(list(PROMPT_IDS), params) for _ in range(requests))
        )
        assert all(len(out.token_ids) == NEW_TOKENS for out in outs)

    started = time.perf_counter()
    asyncio.run(run())
    return time.perf_counter() - started


def test_same_weights_same_logits(shape: tuple) -> None:
    name, directory, gguf_path = shape
    from tests.helpers.paged_logits import full_logits

    llm = load_llama_cpp(gguf_path)
    llm.eval(PROMPT_IDS)
    theirs = torch.tensor(llm.scores[: len(PROMPT_IDS)])
    engine = Engine.from_pretrained(directory, EngineConfig(device="cpu", warmup=False))
    ours = full_logits(engine, PROMPT_IDS).float()
    agreement = float((ours.argmax(-1) == theirs.argmax(-1)).float().mean())
    print(
        f"\n{name}: top-1 agreement with llama.cpp f16 {agreement:.2f}, max |logit diff| "
        f"{float((ours - theirs).abs().max()):.3f} (logits up to {float(ours.abs().max()):.1f})"
    )
    assert agreement >= 0.9


def test_batch_one_and_concurrent_against_llama_cpp(shape: tuple) -> None:
    name, directory, gguf_path = shape
    llm = load_llama_cpp(gguf_path)
    llama_cpp_round(llm)  # warm
    theirs: list[float] = []
    ratios: dict[str, list[float]] = {fmt: [] for fmt in FORMATS}
    rates: dict[str, list[float]] = {fmt: [] for fmt in FORMATS}
    engines = {fmt: load_engine(directory, options) for fmt, options in FORMATS.items()}
    try:
        for engine in engines.values():
            engine_round(engine)  # warm
        for _ in range(ROUNDS):
            for fmt, engine in engines.items():
                reference = llama_cpp_round(llm)
                ours = engine_round(engine)
                theirs.append(NEW_TOKENS / reference)
                rates[fmt].append(NEW_TOKENS / ours)
                ratios[fmt].append(reference / ours)
        judged = JUDGED[name]
        fallbacks = {
            fmt: getattr(engine.model.compiled_forward, "fallback", None)
            for fmt, engine in engines.items()
        }
        concurrent = statistics.median(
            CONCURRENT * NEW_TOKENS / engine_round(engines[judged], CONCURRENT) for _ in range(2)
        )
    finally:
        for engine in engines.values():
            engine.stop_sync()
    single = statistics.median(theirs)
    print(f"\n{name}: llama.cpp f16, one thread: {single:.0f} tok/s at batch 1")
    for fmt in FORMATS:
        eager = f" (not compiled, ran eagerly: {fallbacks[fmt]})" if fallbacks[fmt] else ""
        print(
            f"{name}: ours {fmt:17s} {statistics.median(rates[fmt]):7.0f} tok/s, "
            f"{statistics.median(ratios[fmt]):.2f}x llama.cpp (median of paired rounds){eager}"
        )
    print(
        f"{name}: ours {judged} (judged) x{CONCURRENT} concurrent: {concurrent:.0f} tok/s "
        f"aggregate, {concurrent / single:.1f}x llama.cpp's single stream"
    )
    # A judged format that fell back to eager mode is not the format that was named.
    assert fallbacks[judged] is None, (name, judged, fallbacks[judged])
    assert statistics.median(ratios[judged]) >= 1.0, (name, judged, ratios[judged])
    assert concurrent >= 2 * single, (name, concurrent, single)


RSS_CHILD = """
import json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
kind, path, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if kind == "llama.cpp":
    import llama_cpp
    before = rss()
    llm = llama_cpp.Llama(path, n_threads=1, n_ctx=512, verbose=False)
    for count, _ in enumerate(llm.generate([1, 40, 41], top_k=1), 1):
        if count == 8:
            break
else:
    import torch
    from engine import Engine, EngineConfig, SamplingParams
    before = rss()
    config = EngineConfig(device="cpu", cpu_threads=1, num_kv_blocks=64, warmup=False, **options)
    engine = Engine.from_pretrained(path, config)
    engine.start_sync()
    import asyncio
    asyncio.run(engine.complete([1, 40, 41], SamplingParams(max_tokens=8, temperature=0)))
    engine.stop_sync()
print(json.dumps({"before": before, "after": rss()}))
"""


def child_rss(kind: str, path: Path, options: dict[str, Any]) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", RSS_CHILD, kind, str(path), json.dumps(options)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_resident_memory_per_format(shape: tuple) -> None:
    name, directory, gguf_path = shape
    rows = {"llama.cpp f16": child_rss("llama.cpp", gguf_path, {})}
    rss_formats = {**WEIGHT_FORMATS, "int8 (float32 activations)": {"quantization": "int8"}}
    for fmt, options in rss_formats.items():
        rows[fmt] = child_rss("engine", directory, options)
    model = {fmt: row["after"] - row["before"] for fmt, row in rows.items()}
    print()
    for fmt, row in rows.items():
        print(
            f"{name}: RSS {fmt:27s} model {model[fmt] / 2**20:7.1f} MiB "
            f"(process {row['after'] / 2**20:7.1f} MiB, {model[fmt] / model['float32']:.2f}x fp32)"
        )
    if name == "75M":  # at 5M the allocator's and the KV cache's own pages weigh as much
        assert model["int8"] <= 0.35 * model["float32"]
        assert model["int8 (float32 activations)"] <= 0.35 * model["float32"]


def test_whole_process_rss_at_a_billion_parameters(tmp_path: Path) -> None:
    """The int8 goal on whole processes, where the model outweighs the runtime: at 75M the
    ~295 MiB that importing torch costs every format is most of an int8 process, so the
    per-format test above compares the model's own pages; here, a 1B-parameter model (22
    layers, 2048 wide, 4 GiB in float32), each process's RSS after one generation, torch and
    everything included."""
    directory = write_hf_llama(
        tmp_path / "1B",
        seed=3,
        vocab_size=VOCAB_SIZE,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        max_position_embeddings=1024,
    )
    rows = {
        fmt: child_rss("engine", directory, WEIGHT_FORMATS[fmt])
        for fmt in ("float32", "bfloat16", "int8", "int4")
    }
    print()
    for fmt, row in rows.items():
        ratio = row["after"] / rows["float32"]["after"]
        print(f"1B: process RSS {fmt:9s} {row['after'] / 2**20:8.1f} MiB, {ratio:.2f}x fp32")
    assert rows["int8"]["after"] <= 0.35 * rows["float32"]["after"]
