"""One forward per step (engine/fused.py) against the two passes it replaced, same run.

    python -m pytest tests/benchmarks/test_fused_step.py -o addopts="" -s -p no:cacheprovider

16 decodes running (128 tokens of context each) and a 900-token prompt chunked alongside;
per chunk size, the median step time of: the decodes alone, the fused step (one forward),
and the two passes (the chunk's forward, then the decodes'), interleaved. Shapes: bundled:tiny
and the 75M shape of tests/benchmarks/test_engine_vs_llama_cpp.py (hidden 1024, 8 layers).

Goals, named before measuring:
- every shape, every chunk: the fused step is faster than the two passes (the peer: today's
  step);
- the fused step takes at most 1.3x a decode-only step at the judged chunk: on CUDA, 240 tokens
  (what a 256-token budget leaves beside 16 decodes, the tier-isolation benchmark's budget), at
  every shape; on a CPU, 16 tokens (the slo policy's smallest chunk, where it shrinks chunks
  under a TPOT objective) at bundled:tiny. A CPU cannot give 1.3x at 240: the chunk's
  attention alone (240 queries over 900 keys) costs more than tiny's whole decode step, and
  at 75M a CPU is compute-bound already at 16 decode rows (~150 MFLOP a row), so every
  prefill row adds its share whatever the batching. Those rows are printed and written, not
  judged against 1.3x. At tiny on a CPU the judged 16-token chunk is near its floor too: the
  16 decodes' whole step is ~2.27M multiply-adds, the chunk's attention alone (16 queries over
  899 keys, 4 heads of 16, 2 layers) 3.68M, and a decode step plus only those two attention
  calls times 1.12-1.41x a decode step (2026-12-02, AMD EPYC VM).
FUSED_BENCH_REPEATS sets the repeats per median (default 20; 3 proves it runs).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine import Engine, EngineConfig  # noqa: E402
from tests.benchmarks.bench_record import load_average, stamp, table, write_section  # noqa: E402
from tests.benchmarks.fused_step_timing import BATCH, LONG_PROMPT, measure  # noqa: E402
from tests.helpers.checkpoints import write_hf_llama  # noqa: E402

REPEATS = int(os.environ.get("FUSED_BENCH_REPEATS", "20"))
CHUNKS = [16, 64, 240]
GOAL_RATIO = 1.3
# The 75M shape, as tests/benchmarks/test_engine_vs_llama_cpp.py's SHAPES["75M"] (importing
# that module would skip this one without llama_cpp).
SHAPE_75M = dict(
    hidden_size=1024,
    intermediate_size=2304,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
)
PAGE = Path(__file__).parents[2] / "docs" / "benchmarks" / "fused-step.md"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
JUDGED_CHUNK = 240 if DEVICE == "cuda" else 16


def judged(shape: str) -> bool:
    """Whether the 1.3x goal is judged at this shape on this device (see the docstring)."""
    return DEVICE == "cuda" or shape == "tiny"


@pytest.fixture(scope="module", params=["tiny", "75M"])
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    config = EngineConfig(device=DEVICE, warmup=False, max_model_len=1024)
    if request.param == "tiny":
        model: Any = "bundled:tiny"
    else:
        model = write_hf_llama(
            tmp_path_factory.mktemp("fused-75M"), seed=11, max_position_embeddings=1024,
            **SHAPE_75M,
        )  # fmt: skip
    engine = Engine.from_pretrained(model, config)
    if DEVICE == "cpu":  # the worker's own thread count, as its steps run
        torch.set_num_threads(engine.worker.threads)
    yield request.param, engine
    engine.stop_sync()


def test_fused_step_against_two_passes(engine: tuple[str, Engine]) -> None:
    shape, running = engine
    load = load_average()
    results = measure(running, CHUNKS, REPEATS)
    rows = [
        [
            shape,
            DEVICE,
            r.chunk,
            f"{r.decode_s * 1e3:.2f}",
            f"{r.fused_s * 1e3:.2f}",
            f"{r.two_pass_s * 1e3:.2f}",
            f"{r.fused_ratio:.2f}x",
            f"{r.two_pass_ratio:.2f}x",
        ]
        for r in results
    ]
    header = ["shape", "device", "chunk", "decode ms", "fused ms", "two-pass ms", "fused / decode",
              "two-pass / decode"]  # fmt: skip
    text = table(header, rows)
    print(f"\n{BATCH} decodes + a {LONG_PROMPT}-token prompt chunked alongside\n{text}")
    goal = "judged" if judged(shape) else "not judged here (compute-bound CPU)"
    write_section(
        PAGE,
        "Fused step: decodes and a prefill chunk in one forward",
        f"fused-{shape}-{DEVICE}",
        f"{stamp(load)}\n\n{text}\n\nAt chunk {JUDGED_CHUNK}: 1.3x goal {goal}.",
    )
    for r in results:
        assert r.fused_s < r.two_pass_s, (
            f"{shape}, chunk {r.chunk}: fused {r.fused_s:.4f} s, two passes {r.two_pass_s:.4f} s"
        )
    at = next(r for r in results if r.chunk == JUDGED_CHUNK)
    if judged(shape):
        assert at.fused_ratio <= GOAL_RATIO, (
            f"{shape}: fused step {at.fused_ratio:.2f}x decode-only"
        )
